//! Issue 11 (1) on MCP, through the real binary: a `tools/call`'s arguments are one
//! intention as exact decimals. Numbers that differ as decimals (past 64 bits, or with
//! more digits than a double holds) run the tool twice; `1.0` and `1`, `1e2` and `100`
//! run it once, the second call a replay. The arguments reach the MCP server as the
//! client wrote them, in a single message and in a batch.
//!
//! The MCP server here is a small JSON-RPC server that records every body it receives
//! and counts the runs of each tool, so the test sees the exact bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::routing::post;
use serde_json::{json, Value};

use crate::common::{post as http_post, upstream, Gateway};

#[derive(Default)]
struct Server {
    bodies: Mutex<Vec<String>>,
    runs: Mutex<HashMap<String, usize>>,
}

impl Server {
    fn runs(&self, tool: &str) -> usize {
        self.runs.lock().unwrap().get(tool).copied().unwrap_or(0)
    }

    fn answer(&self, message: &Value) -> Option<Value> {
        let id = message.get("id")?.clone();
        let result = if message["method"] == "tools/call" {
            let tool = message["params"]["name"].as_str().unwrap_or("").to_string();
            let mut runs = self.runs.lock().unwrap();
            let n = runs.entry(tool.clone()).or_default();
            *n += 1;
            json!({"content": [{"type": "text", "text": format!("{tool} run #{n}")}]})
        } else {
            json!({})
        };
        Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
    }
}

async fn start_server() -> (Arc<Server>, u16) {
    let server = Arc::new(Server::default());
    let s = server.clone();
    let router = axum::Router::new().route(
        "/mcp",
        post(move |body: String| {
            let s = s.clone();
            async move {
                s.bodies.lock().unwrap().push(body.clone());
                // Also reads `1e400`, which serde_json refuses.
                let message = oncely_mcp::jsonrpc::parse(body.as_bytes()).unwrap_or(Value::Null);
                let answer = match &message {
                    Value::Array(items) => {
                        Value::Array(items.iter().filter_map(|m| s.answer(m)).collect())
                    }
                    m => s.answer(m).unwrap_or(Value::Null),
                };
                ([("content-type", "application/json")], answer.to_string())
            }
        }),
    );
    let addr = upstream(router).await;
    (server, addr.port())
}

fn gateway(dir: &std::path::Path, port: u16) -> Gateway {
    let config = dir.join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            r#"store = "sqlite://{}"

[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:{port}/mcp"
window = "1h"
wait = "5s"
timeout = "5s"
"#,
            dir.join("ledger.db").display()
        ),
    )
    .unwrap();
    Gateway::start(&["--config", config.to_str().unwrap()], &[])
}

/// Posts `body` as it is; the JSON-RPC messages answered.
async fn call(url: &str, body: &str) -> Vec<Value> {
    let answer = http_post(
        url,
        body,
        &[
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-06-18"),
            ("authorization", "Bearer sk_alice"),
        ],
    )
    .await;
    assert!(
        answer.status.is_success(),
        "{}: {}",
        answer.status,
        answer.text()
    );
    let text = answer.text();
    let parsed = if text.trim_start().starts_with(['{', '[']) {
        vec![serde_json::from_str::<Value>(&text).unwrap()]
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    };
    parsed
        .into_iter()
        .flat_map(|m| match m {
            Value::Array(items) => items,
            m => vec![m],
        })
        .collect()
}

fn tools_call(id: u32, tool: &str, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}"#
    )
}

/// The replay status of the answer to `id` (`None` for a fresh run).
fn replay(messages: &[Value], id: u32) -> Option<String> {
    let m = messages
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no answer {id} in {messages:?}"));
    assert!(m["result"]["content"].is_array(), "{m}");
    m["result"]["_meta"]["dev.oncely/replay"]["status"]
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_call_arguments_are_one_intention_as_exact_decimals() {
    let dir = tempfile::tempdir().unwrap();
    let (server, port) = start_server().await;
    let gw = gateway(dir.path(), port);
    let url = gw.url("/mcp");

    // Numbers that differ as decimals: two intentions, the tool runs twice.
    let differ = [
        ("charge", "9007199254740993", "9007199254740992"),
        (
            "refund",
            "123456789012345678901234567891",
            "123456789012345678901234567890",
        ),
        ("transfer", "0.10000000000000000001", "0.1"),
        // Past the range of a double: still JSON, still guarded.
        ("order", "1e400", "1e401"),
    ];
    let mut id = 0;
    for (tool, a, b) in differ {
        for n in [a, b] {
            id += 1;
            let answered = call(&url, &tools_call(id, tool, &format!(r#"{{"id":{n}}}"#))).await;
            assert_eq!(replay(&answered, id), None, "{tool}({n}) ran: {answered:?}");
        }
        assert_eq!(
            server.runs(tool),
            2,
            "{tool}: {a} and {b} are two intentions"
        );
    }

    // Numbers equal as decimals: one intention, the second call is a replay.
    for (tool, a, b) in [("render", "1.0", "1"), ("print", "1e2", "100")] {
        id += 1;
        let first = call(&url, &tools_call(id, tool, &format!(r#"{{"n":{a}}}"#))).await;
        assert_eq!(replay(&first, id), None);
        id += 1;
        let second = call(&url, &tools_call(id, tool, &format!(r#"{{ "n" : {b} }}"#))).await;
        assert_eq!(
            replay(&second, id).as_deref(),
            Some("replayed"),
            "{second:?}"
        );
        assert_eq!(
            server.runs(tool),
            1,
            "{tool}: {a} and {b} are one intention"
        );
    }

    // ... and `1e400` again is a replay, not a third run of a call passed unguarded.
    id += 1;
    let again = call(&url, &tools_call(id, "order", r#"{"id":1E+400}"#)).await;
    assert_eq!(replay(&again, id).as_deref(), Some("replayed"), "{again:?}");
    assert_eq!(server.runs("order"), 2);

    // The arguments reach the server with every digit, next to the downstream key.
    let bodies = server.bodies.lock().unwrap().clone();
    let refund = bodies
        .iter()
        .find(|b| b.contains("\"refund\"") && b.contains("567891"))
        .expect("the refund call reached the server");
    assert!(
        refund.contains(r#""arguments":{"id":123456789012345678901234567891}"#),
        "the arguments as the client wrote them: {refund}"
    );
    let sent: Value = serde_json::from_str(refund).unwrap();
    assert!(
        sent["params"]["_meta"]["dev.oncely/idempotency-key"].is_string(),
        "{refund}"
    );

    // In a batch: two guarded calls whose numbers differ past a double run twice, and
    // each reaches the server with every digit.
    let batch = format!(
        "[{},{},{}]",
        tools_call(
            101,
            "settle",
            r#"{"amount":12345678901234567890.000000000001}"#
        ),
        tools_call(
            102,
            "settle",
            r#"{"amount":12345678901234567890.000000000002}"#
        ),
        r#"{"jsonrpc":"2.0","id":103,"method":"ping"}"#
    );
    let answered = call(&url, &batch).await;
    assert_eq!(replay(&answered, 101), None, "{answered:?}");
    assert_eq!(replay(&answered, 102), None, "{answered:?}");
    assert!(answered.iter().any(|m| m["id"] == 103), "{answered:?}");
    assert_eq!(server.runs("settle"), 2, "two amounts, two settlements");
    let bodies = server.bodies.lock().unwrap().clone();
    for digits in [
        "12345678901234567890.000000000001",
        "12345678901234567890.000000000002",
    ] {
        assert!(
            bodies.iter().any(|b| b.contains(digits)),
            "{digits} reached the server as written: {bodies:?}"
        );
    }
    assert_eq!(gw.terminate().code(), Some(0));
}

/// A `tools/call` whose JSON repeats a member name (in its arguments, its params, or the
/// message itself) is refused with a JSON-RPC error and never reaches the server: servers
/// disagree on which value counts, so oncely cannot know which call it would guard. In a
/// batch, only that call is refused; the others run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_call_that_repeats_a_member_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (server, port) = start_server().await;
    let gw = gateway(dir.path(), port);
    let url = gw.url("/mcp");
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2025-06-18"),
        ("authorization", "Bearer sk_alice"),
    ];

    // The plain call runs once.
    let first = call(&url, &tools_call(1, "charge", r#"{"amount":2}"#)).await;
    assert_eq!(replay(&first, 1), None);
    for (id, body) in [
        (2, tools_call(2, "charge", r#"{"amount":1000,"amount":2}"#)),
        (
            3,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"charge","arguments":{"amount":1000}},"params":{"name":"charge","arguments":{"amount":2}}}"#
                .to_string(),
        ),
        (
            4,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"charge","name":"refund","arguments":{"amount":2}}}"#
                .to_string(),
        ),
        // With a number serde_json cannot hold, too.
        (5, tools_call(5, "charge", r#"{"amount":1e400,"amount":2}"#)),
    ] {
        let answer = http_post(&url, &body, &headers).await;
        assert_eq!(answer.status.as_u16(), 400, "{body}: {}", answer.text());
        let error: Value = serde_json::from_str(&answer.text()).unwrap();
        assert_eq!(error["id"], id, "{error}");
        assert_eq!(error["error"]["code"], -32600, "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("repeats a member name"),
            "{error}"
        );
    }
    assert_eq!(server.runs("charge"), 1, "no repeated-name call ran");
    assert_eq!(server.runs("refund"), 0);

    // In a batch: the repeated-name call is refused, the rest runs.
    let batch = format!(
        "[{},{},{}]",
        tools_call(11, "charge", r#"{"amount":5,"amount":6}"#),
        tools_call(12, "refund", r#"{"amount":7}"#),
        r#"{"jsonrpc":"2.0","id":13,"method":"ping"}"#
    );
    let answered = call(&url, &batch).await;
    let refused = answered
        .iter()
        .find(|m| m["id"] == 11)
        .unwrap_or_else(|| panic!("no answer 11 in {answered:?}"));
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert_eq!(replay(&answered, 12), None, "{answered:?}");
    assert!(answered.iter().any(|m| m["id"] == 13), "{answered:?}");
    assert_eq!(server.runs("charge"), 1);
    assert_eq!(server.runs("refund"), 1);
    let bodies = server.bodies.lock().unwrap().clone();
    assert!(
        !bodies.iter().any(|b| b.contains(r#""amount":5"#)),
        "the refused call reached the server: {bodies:?}"
    );
    assert_eq!(gw.terminate().code(), Some(0));
}
