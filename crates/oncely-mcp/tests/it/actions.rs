//! Issue 12 (3): tools of class `action` (`actions = [...]`) whose call fails ambiguously
//! end in `outcome_unknown`, never in a second run; a stream that ends without the call's
//! response is never released, whatever the class; and the derived downstream key reaches
//! the server as `_meta["dev.oncely/idempotency-key"]`.
//!
//! The upstream is a small HTTP/1.1 MCP server on a raw socket, so that it can do what a
//! failing server does: never answer, close the connection after reading the call, or end
//! an event stream without the response. It keeps every `tools/call` it received.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioExecutor;
use oncely_core::{Resolution, State};
use oncely_mcp::McpConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::Gateway;

/// The `tools/call` messages the upstream received, as it read them.
#[derive(Clone, Default)]
pub(crate) struct Received(Arc<Mutex<Vec<Value>>>, Arc<Mutex<Vec<String>>>);

impl Received {
    /// The methods of every message the upstream received, in order.
    pub(crate) fn methods(&self) -> Vec<String> {
        self.1.lock().unwrap().clone()
    }

    pub(crate) fn calls(&self, tool: &str, arguments: &Value) -> Vec<Value> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m["params"]["name"] == tool && &m["params"]["arguments"] == arguments)
            .cloned()
            .collect()
    }
}

/// Reads one HTTP/1.1 request (headers and a Content-Length body): its head (lowercased)
/// and body.
async fn read_request_head(stream: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some((head, buf[end + 4..end + 4 + length].to_vec()));
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn write_response(stream: &mut tokio::net::TcpStream, content_type: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.flush().await;
}

/// Starts the upstream; a `tools/call` behaves as its `arguments.mode` says: `ok` (a
/// result), `slow` (a result after `ms` milliseconds), `big` (a result of 5000 characters),
/// `task` (a task of the server's own, `upstream-task-N`, completed at the second
/// `tasks/get` of the run, which must carry its routing headers), `hang` (no answer for a
/// minute), `reset` (the connection closes after the call
/// was read), `sse_end` (an event stream with a progress notification, then its end
/// without the response).
pub(crate) async fn failing_upstream(received: Received) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let received = received.clone();
            tokio::spawn(async move {
                let Some((head, body)) = read_request_head(&mut stream).await else {
                    return;
                };
                let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let id = message["id"].clone();
                let method = message["method"].as_str().unwrap_or("").to_string();
                let polls = {
                    let mut methods = received.1.lock().unwrap();
                    methods.push(method.clone());
                    methods.iter().filter(|m| *m == "tasks/get").count()
                };
                let task = message["params"]["taskId"].as_str().unwrap_or("");
                if method == "tasks/get" && task.starts_with("upstream-task-") {
                    // Its own task, checked as a 2026-07-28 server checks the routing
                    // headers: working at the first poll, completed after.
                    let header = |name: &str| {
                        head.lines()
                            .find_map(|l| l.strip_prefix(&format!("{name}:")))
                            .map(str::trim)
                            .unwrap_or("")
                            .to_string()
                    };
                    let answer = if header("mcp-method") != method || header("mcp-name") != task {
                        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32020,
                            "message": format!("routing headers {head:?} do not match the body")}})
                    } else if polls < 2 {
                        json!({"jsonrpc": "2.0", "id": id, "result": {"resultType": "complete",
                            "taskId": task, "status": "working", "pollIntervalMs": 50}})
                    } else {
                        let result = json!({"resultType": "complete",
                            "content": [{"type": "text", "text": format!("done by {task}")}]});
                        json!({"jsonrpc": "2.0", "id": id, "result": {"resultType": "complete",
                            "taskId": task, "status": "completed", "result": result}})
                    };
                    write_response(&mut stream, "application/json", &answer.to_string()).await;
                    return;
                }
                if message["method"] != "tools/call" {
                    // Anything else is answered with what the server was asked.
                    let result = json!({"resultType": "complete", "method": message["method"], "params": message["params"]});
                    let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
                    write_response(&mut stream, "application/json", &answer.to_string()).await;
                    return;
                }
                let n = {
                    let mut all = received.0.lock().unwrap();
                    all.push(message.clone());
                    all.len()
                };
                let arguments = &message["params"]["arguments"];
                let mut text = format!("done (call #{n})");
                match arguments["mode"].as_str() {
                    Some("hang") => return tokio::time::sleep(Duration::from_secs(60)).await,
                    Some("slow") => {
                        let ms = arguments["ms"].as_u64().unwrap_or(500);
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    Some("big") => text = format!("{} (call #{n})", "x".repeat(5000)),
                    _ => {}
                }
                match arguments["mode"].as_str() {
                    Some("reset") => drop(stream),
                    Some("task") => {
                        let task = json!({"resultType": "task", "taskId": format!("upstream-task-{n}"),
                            "status": "working", "createdAt": "2026-12-01T00:00:00Z",
                            "lastUpdatedAt": "2026-12-01T00:00:00Z", "ttlMs": 60000,
                            "pollIntervalMs": 50});
                        let answer = json!({"jsonrpc": "2.0", "id": id, "result": task});
                        write_response(&mut stream, "application/json", &answer.to_string()).await;
                    }
                    Some("sse_break") => {
                        // Chunked, and the connection is dropped before the last chunk.
                        let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progressToken": 1, "progress": 1}});
                        let event = format!("event: message\ndata: {progress}\n\n");
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
                            event.len()
                        );
                        let _ = stream.write_all(head.as_bytes()).await;
                        let _ = stream.flush().await;
                        drop(stream);
                    }
                    Some("sse_end") => {
                        let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progressToken": 1, "progress": 1}});
                        let body = format!("event: message\ndata: {progress}\n\n");
                        write_response(&mut stream, "text/event-stream", &body).await;
                    }
                    _ => {
                        let result = json!({"content": [{"type": "text", "text": text}]});
                        let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
                        write_response(&mut stream, "application/json", &answer.to_string()).await;
                    }
                }
            });
        }
    });
    format!("http://127.0.0.1:{}/mcp", addr.port())
}

/// Posts one JSON-RPC message; returns the JSON answer (or the status and text).
pub(crate) async fn post(url: &str, headers: &[(&str, &str)], body: Value) -> Value {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if !headers.iter().any(|(k, _)| *k == "authorization") {
        req = req.header("authorization", "Bearer sk_actions");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::from(body.to_string()))).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap_or_else(
        |_| json!({"http_status": status.as_u16(), "text": String::from_utf8_lossy(&bytes)}),
    )
}

pub(crate) fn call(id: i64, tool: &str, arguments: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}})
}

fn config(upstream: &str) -> McpConfig {
    McpConfig::new("/mcp", upstream)
        .unwrap()
        .with_actions(&["charge_*".into()])
        .unwrap()
        .with_duration("timeout", "1s")
        .unwrap()
        .with_duration("wait", "2s")
        .unwrap()
}

fn replay_status(answer: &Value) -> Option<&str> {
    answer["result"]["_meta"]["dev.oncely/replay"]["status"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_that_fails_ambiguously_is_outcome_unknown_and_never_runs_twice() {
    let received = Received::default();
    let gw = Gateway::start(config(&failing_upstream(received.clone()).await)).await;
    for mode in ["hang", "reset", "sse_end"] {
        let args = json!({"mode": mode, "amount": 42});
        let first = post(&gw.url, &[], call(1, "charge_card", &args)).await;
        let records = gw.store.list(&Default::default()).await.unwrap();
        let record = records
            .iter()
            .find(|r| {
                r.route == "/mcp#charge_card"
                    && r.last_error.is_some()
                    && r.state == State::OutcomeUnknown
            })
            .unwrap_or_else(|| panic!("{mode}: an outcome_unknown record: {records:?}"));
        assert_eq!(record.class, oncely_core::Class::Action);
        let id = record.id.as_str().to_string();
        if mode == "sse_end" {
            // The caller read the stream as the server sent it: no response in it.
            assert!(first.get("result").is_none(), "{mode}: {first}");
        } else {
            assert_eq!(first["result"]["isError"], true, "{mode}: {first}");
            assert_eq!(
                replay_status(&first),
                Some("outcome_unknown"),
                "{mode}: {first}"
            );
            let text = first["result"]["content"][0]["text"].as_str().unwrap();
            assert!(
                text.contains("unknown whether it took effect")
                    && text.contains("do not retry")
                    && text.contains(&format!("oncely ledger resolve {id} --released"))
                    && text.contains(&format!("oncely ledger resolve {id} --completed")),
                "{mode}: {text}"
            );
        }
        // A duplicate is told so, and the tool is not run again.
        let again = post(&gw.url, &[], call(2, "charge_card", &args)).await;
        assert_eq!(again["id"], 2);
        assert_eq!(again["result"]["isError"], true, "{mode}: {again}");
        assert_eq!(
            replay_status(&again),
            Some("outcome_unknown"),
            "{mode}: {again}"
        );
        assert!(again["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains(&format!("oncely ledger resolve {id}")));
        assert_eq!(
            received.calls("charge_card", &args).len(),
            1,
            "{mode}: ran once"
        );
        gw.store
            .resolve(
                &record.id,
                Resolution::Released {
                    window: std::time::Duration::from_secs(3600),
                    reason: "checked: it did not happen".into(),
                },
            )
            .await
            .unwrap();
    }
    // Once reconciled as not done, the same call runs again.
    let args = json!({"mode": "reset", "amount": 42});
    post(&gw.url, &[], call(3, "charge_card", &args)).await;
    assert_eq!(received.calls("charge_card", &args).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_tool_is_released_after_a_reset_but_never_after_a_stream_end() {
    let received = Received::default();
    let gw = Gateway::start(config(&failing_upstream(received.clone()).await)).await;
    // Class write: a reset after sending releases the record; the retry runs again.
    let reset = json!({"mode": "reset"});
    let first = post(&gw.url, &[], call(1, "render", &reset)).await;
    assert_eq!(first["code"], "upstream_failed", "{first}");
    post(&gw.url, &[], call(2, "render", &reset)).await;
    assert_eq!(received.calls("render", &reset).len(), 2);
    // A stream that ends (or breaks off) without the response: the call was sent and may
    // have run.
    for mode in ["sse_end", "sse_break"] {
        let ended = json!({ "mode": mode });
        post(&gw.url, &[], call(3, "render", &ended)).await;
        let again = post(&gw.url, &[], call(4, "render", &ended)).await;
        assert_eq!(
            replay_status(&again),
            Some("outcome_unknown"),
            "{mode}: {again}"
        );
        assert_eq!(
            received.calls("render", &ended).len(),
            1,
            "{mode}: never run twice"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_downstream_key_reaches_the_server_in_meta() {
    let received = Received::default();
    let gw = Gateway::start(config(&failing_upstream(received.clone()).await)).await;
    let reset = json!({"mode": "reset", "n": 1});
    let mut with_meta = call(1, "render", &reset);
    with_meta["params"]["_meta"] = json!({"progressToken": "p1", "trace": "kept"});
    post(&gw.url, &[], with_meta).await;
    post(&gw.url, &[], call(2, "render", &reset)).await;
    let other = json!({"mode": "ok", "n": 2});
    post(&gw.url, &[], call(3, "render", &other)).await;
    let calls = received.calls("render", &reset);
    assert_eq!(calls.len(), 2);
    let key = |m: &Value| {
        m["params"]["_meta"]["dev.oncely/idempotency-key"]
            .as_str()
            .unwrap_or_else(|| panic!("no key in {m}"))
            .to_string()
    };
    assert!(key(&calls[0]).starts_with("oncely-"), "{}", calls[0]);
    assert_eq!(
        key(&calls[0]),
        key(&calls[1]),
        "the same call, the same key"
    );
    assert_eq!(
        calls[0]["params"]["_meta"]["progressToken"], "p1",
        "other _meta kept"
    );
    assert_eq!(calls[0]["params"]["_meta"]["trace"], "kept");
    assert_eq!(calls[0]["id"], 1, "the request id is kept");
    let other_call = &received.calls("render", &other)[0];
    assert_ne!(
        key(other_call),
        key(&calls[0]),
        "other arguments, another key"
    );
    // The key is the one the ledger derives for the record.
    let records = gw.store.list(&Default::default()).await.unwrap();
    let record = records
        .iter()
        .find(|r| r.state == State::Completed)
        .unwrap();
    let expected = oncely_core::DownstreamKey::derive(&record.scope, &record.key);
    assert_eq!(key(other_call), expected.as_str());
}

/// Issue 12 (5): a client's cancellation is honoured towards it (its request gets no
/// answer, as the revision says) and never reaches the guarded call, which runs to its end
/// and answers the retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_gets_no_answer_and_the_call_runs_on() {
    let received = Received::default();
    let config = config(&failing_upstream(received.clone()).await)
        .with_duration("timeout", "10s")
        .unwrap()
        .with_duration("wait", "10s")
        .unwrap();
    let gw = Gateway::start(config).await;
    let session = [
        ("mcp-session-id", "session-1"),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let slow = json!({"mode": "slow", "ms": 1500});
    let cancel = |id: i64| {
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "timed out"}})
    };
    let first = tokio::spawn({
        let url = gw.url.clone();
        let slow = slow.clone();
        async move { post(&url, &session, call(1, "render", &slow)).await }
    });
    // Wait until the call reached the server, then a duplicate joins it.
    while received.calls("render", &slow).is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = tokio::spawn({
        let url = gw.url.clone();
        let slow = slow.clone();
        async move { post(&url, &session, call(2, "render", &slow)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    for id in [2, 1] {
        let ack = post(&gw.url, &session, cancel(id)).await;
        assert_eq!(ack["http_status"], 202, "{ack}");
    }
    // Both requests end without a response: the client cancelled them.
    for (id, request) in [(1, first), (2, second)] {
        let answer = request.await.unwrap();
        assert_eq!(answer["http_status"], 200, "{id}: {answer}");
        assert_eq!(
            answer["text"], "",
            "{id}: no response to a cancelled request"
        );
    }
    // The call ran on, once, and the retry gets its result.
    let retry = post(&gw.url, &session, call(3, "render", &slow)).await;
    assert_eq!(
        retry["result"]["content"][0]["text"], "done (call #1)",
        "{retry}"
    );
    assert!(
        matches!(replay_status(&retry), Some("joined" | "replayed")),
        "{retry}"
    );
    assert_eq!(received.calls("render", &slow).len(), 1);
    assert!(
        !received
            .methods()
            .iter()
            .any(|m| m == "notifications/cancelled"),
        "no cancellation reached the server: {:?}",
        received.methods()
    );
}
