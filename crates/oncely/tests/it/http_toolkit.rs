//! The one HTTP toolkit (`oncely-http`) seen from outside, through the real binary: every
//! part of the gateway answers its own errors with one problem+json shape, and MCP tool
//! calls log the same request line as HTTP routes.

use std::time::Duration;

use axum::routing::post as route_post;

use crate::common::{get, post, upstream, Gateway};

/// Asserts `a` is oncely's problem document for `code` with `status`: the content type,
/// `type` naming the code (no `about:blank`), a title, and the status inside and out.
fn assert_problem(what: &str, a: &crate::common::Answer, status: u16, code: &str) {
    assert_eq!(a.status.as_u16(), status, "{what}: {}", a.text());
    assert_eq!(
        a.header("content-type"),
        "application/problem+json",
        "{what}"
    );
    let doc = a.json();
    assert_eq!(doc["code"], code, "{what}: {doc}");
    assert_eq!(
        doc["type"],
        format!("urn:oncely:problem:{code}"),
        "{what}: {doc}"
    );
    assert_eq!(doc["status"], status, "{what}: {doc}");
    assert!(
        doc["title"].as_str().is_some_and(|t| !t.is_empty()),
        "{what}: {doc}"
    );
    assert!(doc["detail"].is_string(), "{what}: {doc}");
}

fn config(dir: &std::path::Path, up: std::net::SocketAddr) -> String {
    let cfg = dir.join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = "sqlite://{db}"
upstream = "http://{up}"

[[routes]]
method = "POST"
path = "/v1/keyed"
key = "header"

[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:9/mcp"

[[mcp]]
path = "/mcp-up"
upstream = "http://{up}/mcp"

[[webhooks]]
path = "/hooks"
verify = "stripe"
secret_env = "TOOLKIT_TEST_WEBHOOK_SECRET"
deliver_to = "http://{up}/internal"
"#,
            db = dir.join("ledger.db").display()
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_owned()
}

fn mcp_upstream() -> axum::Router {
    axum::Router::new()
        .route(
            "/mcp",
            route_post(|body: axum::Json<serde_json::Value>| async move {
                let result = serde_json::json!({"content": [{"type": "text", "text": "ok"}]});
                axum::Json(
                    serde_json::json!({"jsonrpc": "2.0", "id": body.0["id"], "result": result}),
                )
            }),
        )
        .fallback(|| async { "ok" })
}

const MCP_HEADERS: [(&str, &str); 4] = [
    ("authorization", "Bearer sk_alice"),
    ("content-type", "application/json"),
    ("accept", "application/json, text/event-stream"),
    ("mcp-protocol-version", "2025-11-25"),
];

/// The gateway's routes, an MCP endpoint, a webhook endpoint and the admin API each
/// answer an error of their own as one problem+json shape: `type` is
/// `urn:oncely:problem:CODE` everywhere (the MCP endpoint and the admin API said
/// `about:blank`), with the code's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_part_answers_its_problems_in_one_shape() {
    let up = upstream(mcp_upstream()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), up);
    let gw = Gateway::start(
        &["--config", &cfg],
        &[(
            "TOOLKIT_TEST_WEBHOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )],
    );
    let auth = [("authorization", "Bearer sk_alice")];

    let gateway = post(&gw.url("/v1/keyed"), "{}", &auth).await;
    assert_problem("gateway", &gateway, 400, "key_missing");

    let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "render", "arguments": {}}});
    let mcp = post(&gw.url("/mcp"), &call.to_string(), &MCP_HEADERS).await;
    assert_problem("mcp", &mcp, 502, "upstream_unreachable");

    let unsigned = post(&gw.url("/hooks"), "{\"id\":\"evt_1\"}", &[]).await;
    assert_problem("webhook", &unsigned, 400, "signature_invalid");
    let wrong_method = get(&gw.url("/hooks"), &[]).await;
    assert_problem("webhook method", &wrong_method, 405, "method_not_allowed");
    assert_eq!(wrong_method.header("allow"), "POST");

    // No admin token variable set: the admin API is closed.
    let admin = get(&gw.admin_url("/records"), &[]).await;
    assert_problem("admin", &admin, 403, "admin_disabled");
}

/// A guarded MCP tool call logs the request line of every guarded request: target
/// `oncely::request`, every contract field (`null` when absent), plus its `tool`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_calls_log_the_request_line_of_every_guarded_request() {
    let up = upstream(mcp_upstream()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), up);
    let gw = Gateway::start(
        &["--config", &cfg, "--log-format", "json"],
        &[(
            "TOOLKIT_TEST_WEBHOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )],
    );
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "render", "arguments": {"text": "hi"}}});
    for want in ["fresh", "replayed"] {
        let a = post(&gw.url("/mcp-up"), &call.to_string(), &MCP_HEADERS).await;
        assert!(a.status.is_success(), "{}: {}", a.status, a.text());
        assert_eq!(a.header("oncely-status"), want);
    }
    let mut lines = Vec::new();
    for _ in 0..100 {
        lines = gw
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == "mcp tools/call")
            .collect();
        if lines.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lines.len(), 2, "{lines:#?}");
    for (line, want) in lines.iter().zip(["fresh", "replayed"]) {
        assert_eq!(line["target"], "oncely::request", "{line}");
        assert_eq!(line["status"], want, "{line}");
        assert_eq!(line["route"], "/mcp-up#render", "{line}");
        assert_eq!(line["tool"], "render", "{line}");
        for field in [
            "record",
            "route",
            "principal",
            "status",
            "attempt",
            "workflow_id",
            "upstream_status",
            "provider_request_id",
            "duration_ms",
        ] {
            assert!(line.get(field).is_some(), "{field} missing: {line}");
        }
        assert!(line["record"].is_string(), "{line}");
        assert_eq!(line["workflow_id"], serde_json::Value::Null, "{line}");
    }
}

/// Webhook deliveries go through the gateway's one upstream client: an `https://`
/// `deliver_to` (the docs allow it) is reached and verified against `upstream_ca` like
/// any upstream. (The delivery worker had a plain-HTTP client of its own, which refused
/// every `https://` target.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_deliveries_reach_an_https_handler_trusted_by_upstream_ca() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let pki = crate::common::TestPki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.write(dir.path());
    let delivered = Arc::new(AtomicUsize::new(0));
    let counter = delivered.clone();
    let handler = crate::common::https_upstream(
        &pki,
        axum::Router::new().route(
            "/internal",
            route_post(move |headers: axum::http::HeaderMap| {
                let counter = counter.clone();
                async move {
                    assert_eq!(headers["idempotency-key"], "evt_tls_1");
                    counter.fetch_add(1, Ordering::SeqCst);
                    "ok"
                }
            }),
        ),
    )
    .await;
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = "sqlite://{db}"
upstream = "http://127.0.0.1:9"
upstream_ca = "ca.pem"

[[webhooks]]
path = "/hooks"
verify = "standard"
secret_env = "TOOLKIT_TEST_WEBHOOK_SECRET"
deliver_to = "https://localhost:{port}/internal"
deliver_timeout = "2s"
retry_backoff = "20ms"
"#,
            db = dir.path().join("ledger.db").display(),
            port = handler.port()
        ),
    )
    .unwrap();
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let gw = Gateway::start(
        &["--config", cfg.to_str().unwrap()],
        &[("TOOLKIT_TEST_WEBHOOK_SECRET", secret)],
    );
    let scheme: oncely_webhooks::Scheme = "standard".parse().unwrap();
    let secrets = oncely_webhooks::Secrets::parse(&scheme, secret).unwrap();
    let body = r#"{"type":"invoice.paid","id":"evt_tls_1"}"#;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let signed = oncely_webhooks::sign(
        &scheme,
        secrets.primary(),
        "evt_tls_1",
        now,
        body.as_bytes(),
    );
    let mut headers: Vec<(&str, &str)> = signed
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    headers.push(("content-type", "application/json"));
    let a = post(&gw.url("/hooks"), body, &headers).await;
    assert_eq!(a.status, 200, "{}", a.text());
    for _ in 0..200 {
        if delivered.load(Ordering::SeqCst) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        delivered.load(Ordering::SeqCst),
        1,
        "delivered over TLS: {}",
        gw.lines.lock().unwrap().join("\n")
    );
}
