//! Issue 12 (4): the `io.modelcontextprotocol/tasks` extension (2026-07-28). No official
//! SDK implements it yet, so the client here is built on the published schema: raw
//! Streamable HTTP requests, every task message validated against the extension's JSON
//! Schema (tests/schema/ext-tasks.schema.json) and the Python SDK's 2026-07-28 types.

use std::time::Duration;

use serde_json::{json, Value};

use crate::actions::{call, failing_upstream, post, Received};
use crate::harness::Gateway;
use crate::synthesised::validate_all;

const MODERN: &str = "2026-07-28";

fn headers<'a>(method: &'a str, name: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("mcp-protocol-version", MODERN),
        ("mcp-method", method),
        ("mcp-name", name),
    ]
}

/// A 2026-07-28 `tools/call`, declaring the tasks extension when `tasks`.
fn tool_call(id: i64, tool: &str, args: &Value, tasks: bool) -> Value {
    let mut m = call(id, tool, args);
    m["params"]["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": MODERN});
    if tasks {
        m["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
            json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    }
    m
}

async fn call_tool(gw: &Gateway, id: i64, tool: &str, args: &Value, tasks: bool) -> Value {
    post(
        &gw.url,
        &headers("tools/call", tool),
        tool_call(id, tool, args, tasks),
    )
    .await
}

async fn task_method(gw: &Gateway, auth: &str, id: i64, method: &str, task_id: &str) -> Value {
    let mut h = headers(method, task_id);
    h.push(("authorization", auth));
    let m = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"taskId": task_id,
        "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}}});
    post(&gw.url, &h, m).await
}

fn item(name: &str, kind: &str, message: &Value) -> Value {
    json!({"name": name, "era": MODERN, "kind": kind, "message": message})
}

fn config(upstream: &str) -> oncely_mcp::McpConfig {
    oncely_mcp::McpConfig::new("/mcp", upstream)
        .unwrap()
        .with_duration("wait", "300ms")
        .unwrap()
        .with_duration("timeout", "10s")
        .unwrap()
}

const ALICE: &str = "Bearer sk_actions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_becomes_one_task_for_every_client_that_declared_the_extension() {
    let received = Received::default();
    let gw = Gateway::start(config(&failing_upstream(received.clone()).await)).await;
    let slow = json!({"mode": "slow", "ms": 1500});
    let mut items = Vec::new();

    // A client that declared the extension gets a task once the call outlives `wait`.
    let first = call_tool(&gw, 1, "render", &slow, true).await;
    let task = &first["result"];
    assert_eq!(task["resultType"], "task", "{first}");
    assert_eq!(task["status"], "working");
    let task_id = task["taskId"].as_str().unwrap().to_string();
    let records = gw.store.list(&Default::default()).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(task_id, records[0].id.as_str(), "the task is the record");
    assert!(task["statusMessage"]
        .as_str()
        .unwrap()
        .contains("never cancels the shared execution"));
    items.push(item("CreateTaskResult", "task", &first));

    // A duplicate that declared it gets the same task; one that did not, today's answer.
    let same = call_tool(&gw, 2, "render", &slow, true).await;
    assert_eq!(same["id"], 2);
    assert_eq!(same["result"]["taskId"], task_id.as_str(), "{same}");
    let plain = call_tool(&gw, 3, "render", &slow, false).await;
    assert_eq!(
        plain["result"]["_meta"]["dev.oncely/replay"]["status"], "in_flight",
        "{plain}"
    );
    assert!(plain["result"].get("taskId").is_none());
    items.push(item(
        "in_flight to a client without tasks",
        "tool_result",
        &plain,
    ));

    // tasks/get: working; tasks/cancel is acknowledged and cancels nothing.
    let working = task_method(&gw, ALICE, 4, "tasks/get", &task_id).await;
    assert_eq!(working["result"]["status"], "working", "{working}");
    assert_eq!(working["result"]["resultType"], "complete");
    items.push(item("GetTaskResult working", "get_task", &working));
    let cancelled = task_method(&gw, ALICE, 5, "tasks/cancel", &task_id).await;
    assert_eq!(
        cancelled["result"],
        json!({"resultType": "complete"}),
        "{cancelled}"
    );
    items.push(item("CancelTaskResult", "cancel_task", &cancelled));

    // Another principal cannot read it, nor learn that it exists: -32602, as for a task
    // that never was, and nothing reaches the server.
    let other = task_method(&gw, "Bearer sk_bob", 6, "tasks/get", &task_id).await;
    assert_eq!(other["error"]["code"], -32602, "{other}");
    assert!(!received.methods().iter().any(|m| m.starts_with("tasks/")));

    // Poll until done: the shared execution was not cancelled.
    let done = loop {
        let got = task_method(&gw, ALICE, 7, "tasks/get", &task_id).await;
        if got["result"]["status"] != "working" {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"],
        "done (call #1)"
    );
    assert_eq!(done["result"]["result"]["resultType"], "complete");
    items.push(item("GetTaskResult completed", "get_task", &done));
    assert_eq!(
        received.calls("render", &slow).len(),
        1,
        "one execution for all"
    );

    // Once done, a repeat gets the stored result (a call within `wait` is no task).
    let again = call_tool(&gw, 8, "render", &slow, true).await;
    assert_eq!(
        again["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed"
    );
    items.push(item(
        "replayed to a client with tasks",
        "tool_result",
        &again,
    ));

    // A quick call is answered directly, even to a client that declared the extension.
    let quick = call_tool(&gw, 9, "render", &json!({"mode": "ok"}), true).await;
    assert_eq!(
        quick["result"]["content"][0]["text"], "done (call #2)",
        "{quick}"
    );

    validate_all(&items).await;
}

/// A server that answers a call with a task of its own (the client declared the
/// extension, and its declaration reached the server): the owner follows that task on
/// the server (`tasks/get` with its own routing headers, at the server's poll interval)
/// and the call's result is the task's. What is stored and replayed, to every client, is
/// that result: never the server's task, whose id is not the record's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_the_server_is_followed_and_its_result_is_the_calls() {
    let received = Received::default();
    let gw = Gateway::start(config(&failing_upstream(received.clone()).await)).await;
    let args = json!({"mode": "task"});
    let first = call_tool(&gw, 1, "render", &args, true).await;
    assert_eq!(first["result"]["resultType"], "complete", "{first}");
    assert_eq!(
        first["result"]["content"][0]["text"], "done by upstream-task-1",
        "{first}"
    );
    assert!(first["result"].get("taskId").is_none(), "{first}");
    let same = call_tool(&gw, 2, "render", &args, true).await;
    assert_eq!(
        same["result"]["content"], first["result"]["content"],
        "{same}"
    );
    assert_eq!(
        same["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed"
    );
    // A client without the extension gets the same result.
    let plain = call_tool(&gw, 3, "render", &args, false).await;
    assert_eq!(
        plain["result"]["content"], first["result"]["content"],
        "{plain}"
    );
    assert!(plain["result"].get("isError").is_none(), "{plain}");
    assert_eq!(
        received.calls("render", &args).len(),
        1,
        "the call ran once"
    );
    let polls = received
        .methods()
        .iter()
        .filter(|m| *m == "tasks/get")
        .count();
    assert_eq!(
        polls,
        2,
        "polled until it completed: {:?}",
        received.methods()
    );
    // The server's task is the server's: a client's tasks/get of it passes through.
    let got = task_method(&gw, ALICE, 4, "tasks/get", "upstream-task-1").await;
    assert_eq!(got["result"]["taskId"], "upstream-task-1", "{got}");
    validate_all(&[
        item("server task followed", "tool_result", &first),
        item("server task's result replayed", "tool_result", &same),
        item("to a client without tasks", "tool_result", &plain),
    ])
    .await;
}
