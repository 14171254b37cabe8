//! An `[[mcp]]` endpoint's upstream is sent as a route's is, through the real binary:
//! its `retries` (a connection never made is tried again; nothing that may have reached
//! the server is), its `concurrency` (most guarded tool calls in flight to the server),
//! and the `Forwarded` / `X-Forwarded-*` headers a proxy adds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{json, Value};

use crate::common::{post as http_post, upstream, Gateway};

const AUTH: &str = "Bearer sk_alice";

/// A small paid MCP server that notes, per `tools/call`, the forwarding headers it was
/// sent with, and how many calls ran at once.
#[derive(Default)]
struct Server {
    /// `(method, forwarded, x-forwarded-for)` of every request.
    seen: Mutex<Vec<(String, String, String)>>,
    /// Executions of each tool call, by its arguments.
    executions: Mutex<Vec<Value>>,
    running: Mutex<(usize, usize)>,
}

async fn serve(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    let message: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let method = message["method"].as_str().unwrap_or("").to_string();
    s.seen.lock().unwrap().push((
        method.clone(),
        header("forwarded"),
        header("x-forwarded-for"),
    ));
    let Some(id) = message.get("id").cloned() else {
        return axum::http::StatusCode::ACCEPTED.into_response();
    };
    let result = match method.as_str() {
        "initialize" => json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "paid", "version": "1"}}),
        "tools/list" => json!({"tools": [{"name": "render", "inputSchema": {"type": "object"}}]}),
        "tools/call" => {
            let args = message["params"]["arguments"].clone();
            {
                let mut r = s.running.lock().unwrap();
                r.0 += 1;
                r.1 = r.1.max(r.0);
            }
            s.executions.lock().unwrap().push(args.clone());
            tokio::time::sleep(Duration::from_millis(args["ms"].as_u64().unwrap_or(0))).await;
            s.running.lock().unwrap().0 -= 1;
            json!({"content": [{"type": "text", "text": format!("rendered {args}")}]})
        }
        _ => json!({}),
    };
    (
        [("content-type", "application/json")],
        json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string(),
    )
        .into_response()
}

fn router(server: Arc<Server>) -> axum::Router {
    axum::Router::new()
        .route("/mcp", post(serve))
        .with_state(server)
}

fn gateway(dir: &std::path::Path, port: u16, extra: &str) -> Gateway {
    let config = dir.join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            r#"store = "sqlite://{}"

[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:{port}/mcp"
wait = "30s"
timeout = "30s"
{extra}
"#,
            dir.join("ledger.db").display()
        ),
    )
    .unwrap();
    Gateway::start(&["--config", config.to_str().unwrap()], &[])
}

async fn call(gw: &Gateway, id: u64, arguments: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "render", "arguments": arguments}});
    let answer = http_post(
        &format!("http://{}/mcp", gw.addr),
        &body.to_string(),
        &[
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-06-18"),
            ("authorization", AUTH),
        ],
    )
    .await;
    serde_json::from_slice(&answer.body)
        .unwrap_or_else(|_| json!({"http_status": answer.status.as_u16(), "text": answer.text()}))
}

#[tokio::test]
async fn mcp_upstream_calls_carry_the_forwarding_headers() {
    let server = Arc::new(Server::default());
    let port = upstream(router(server.clone())).await.port();
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), port, "");
    let answer = call(&gw, 1, json!({"scene": "forwarded"})).await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "rendered {\"scene\":\"forwarded\"}",
        "{answer}"
    );
    // An unguarded message goes through the same proxy.
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    http_post(
        &format!("http://{}/mcp", gw.addr),
        &list.to_string(),
        &[
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-06-18"),
            ("authorization", AUTH),
            ("x-forwarded-for", "10.1.2.3"),
        ],
    )
    .await;
    let seen = server.seen.lock().unwrap().clone();
    let host = format!("host=\"{}\"", gw.addr);
    let host_bare = format!("host={}", gw.addr);
    for method in ["tools/call", "tools/list"] {
        let (_, forwarded, xff) = seen
            .iter()
            .find(|(m, _, _)| m == method)
            .unwrap_or_else(|| panic!("the server saw no {method}: {seen:?}"));
        assert!(
            forwarded.starts_with("for=127.0.0.1;proto=http;")
                && (forwarded.contains(&host) || forwarded.contains(&host_bare)),
            "{method}: Forwarded {forwarded:?}"
        );
        let want = if method == "tools/list" {
            "10.1.2.3, 127.0.0.1"
        } else {
            "127.0.0.1"
        };
        assert_eq!(xff, want, "{method}: X-Forwarded-For");
    }
    gw.terminate();
}

#[tokio::test]
async fn mcp_concurrency_bounds_the_guarded_calls_in_flight_to_the_server() {
    let server = Arc::new(Server::default());
    let port = upstream(router(server.clone())).await.port();
    let dir = tempfile::tempdir().unwrap();
    let gw = Arc::new(gateway(dir.path(), port, "concurrency = 2"));
    // Twelve callers: six distinct calls, each sent twice at once.
    let mut calls = Vec::new();
    for i in 0..12u64 {
        let gw = gw.clone();
        calls.push(tokio::spawn(async move {
            call(&gw, i, json!({"scene": i % 6, "ms": 300})).await
        }));
    }
    for (i, c) in calls.into_iter().enumerate() {
        let answer = c.await.unwrap();
        assert_eq!(
            answer["result"]["content"][0]["text"],
            format!("rendered {{\"ms\":300,\"scene\":{}}}", i % 6),
            "call {i}: {answer}"
        );
    }
    let executions = server.executions.lock().unwrap().clone();
    assert_eq!(
        executions.len(),
        6,
        "each distinct call ran once: {executions:?}"
    );
    let most = server.running.lock().unwrap().1;
    assert_eq!(most, 2, "at most `concurrency` calls ran at once");
    Arc::into_inner(gw).unwrap().terminate();
}

#[tokio::test]
async fn mcp_retries_a_connection_that_was_never_made() {
    // A port nobody listens on yet: the server comes up after the first attempts failed.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let without = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), port, "retries = 8\nretry_backoff = \"200ms\"");
    let plain = gateway(without.path(), port, "");
    // Without retries, the refused connection is the answer.
    let refused = call(&plain, 1, json!({"scene": "early"})).await;
    assert_eq!(
        refused["code"], "upstream_unreachable",
        "no retries: the refused connection is the answer: {refused}"
    );
    let server = Arc::new(Server::default());
    let started = {
        let server = server.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .unwrap();
            axum::serve(listener, router(server)).await.unwrap();
        })
    };
    let answer = call(&gw, 2, json!({"scene": "late"})).await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "rendered {\"scene\":\"late\"}",
        "retried until the server was up: {answer}"
    );
    assert_eq!(server.executions.lock().unwrap().len(), 1);
    let retried = gw
        .lines
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("retrying a temporary upstream failure"));
    assert!(retried, "each retry is a log line");
    started.abort();
    gw.terminate();
    plain.terminate();
}
