//! Issue 12 (2): every message oncely writes itself (replays, joins, the still-running
//! answer, too large, outcome unknown, JSON-RPC errors) is valid for the revision the
//! session negotiated, as the official SDKs' own validators judge it: the Python `mcp`
//! package's pydantic wire types of 2025-11-25 and 2026-07-28, and the TypeScript SDK's
//! zod schemas.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::actions::{call, failing_upstream, post, Received};
use crate::harness::{python, Gateway};
use crate::node::{node, node_dir};

const LEGACY: &str = "2025-11-25";
const MODERN: &str = "2026-07-28";

fn headers<'a>(era: &'a str, tool: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("mcp-protocol-version", era)];
    if era == MODERN {
        h.push(("mcp-method", "tools/call"));
        h.push(("mcp-name", tool));
    }
    h
}

/// One message oncely wrote, to validate.
fn item(name: &str, era: &str, kind: &str, message: &Value) -> Value {
    json!({"name": format!("{name} ({era})"), "era": era, "kind": kind, "message": message})
}

async fn send(gw: &Gateway, era: &str, id: i64, tool: &str, args: &Value) -> Value {
    post(&gw.url, &headers(era, tool), call(id, tool, args)).await
}

fn status(answer: &Value) -> &str {
    answer["result"]["_meta"]["dev.oncely/replay"]["status"]
        .as_str()
        .unwrap_or("")
}

/// Produces each kind of message oncely writes, in `era`.
async fn messages(gw: &Gateway, era: &str, out: &mut Vec<Value>) {
    let tag = |mut args: Value| {
        args["era"] = json!(era);
        args
    };
    // A replay.
    let ok = tag(json!({"mode": "ok"}));
    send(gw, era, 1, "render", &ok).await;
    let replayed = send(gw, era, 2, "render", &ok).await;
    assert_eq!(status(&replayed), "replayed", "{replayed}");
    out.push(item("replayed", era, "tool_result", &replayed));

    // A join, and the still-running answer (wait is 500 ms).
    for (name, ms) in [("joined", 200), ("in_flight", 1500)] {
        let slow = tag(json!({"mode": "slow", "ms": ms}));
        let (_, repeat) = tokio::join!(send(gw, era, 3, "render", &slow), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            send(gw, era, 4, "render", &slow).await
        });
        assert_eq!(status(&repeat), name, "{repeat}");
        out.push(item(name, era, "tool_result", &repeat));
    }

    // Too large to keep (max_response is 1000 bytes).
    let big = tag(json!({"mode": "big"}));
    send(gw, era, 5, "render", &big).await;
    let too_large = send(gw, era, 6, "render", &big).await;
    assert_eq!(status(&too_large), "result_too_large", "{too_large}");
    out.push(item("too_large", era, "tool_result", &too_large));

    // An action whose answer was lost, and its duplicate.
    let reset = tag(json!({"mode": "reset"}));
    let unknown = send(gw, era, 7, "charge_card", &reset).await;
    assert_eq!(status(&unknown), "outcome_unknown", "{unknown}");
    out.push(item("outcome_unknown", era, "tool_result", &unknown));
    let duplicate = send(gw, era, 8, "charge_card", &reset).await;
    assert_eq!(status(&duplicate), "outcome_unknown", "{duplicate}");
    out.push(item(
        "outcome_unknown duplicate",
        era,
        "tool_result",
        &duplicate,
    ));

    // A JSON-RPC error oncely writes (2026-07-28: routing headers that disagree).
    if era == MODERN {
        let mismatch = post(
            &gw.url,
            &headers(era, "other"),
            call(9, "render", &json!({"mode": "ok"})),
        )
        .await;
        assert_eq!(mismatch["error"]["code"], -32020, "{mismatch}");
        out.push(item("header mismatch", era, "error", &mismatch));
    }
}

/// Runs a validator (`python validate.py FILE` or `node validate.mjs FILE`) and asserts
/// that it accepted every message.
async fn validate(program: &Path, script: &Path, file: &Path, what: &str) {
    let out = tokio::process::Command::new(program)
        .arg(script)
        .arg(file)
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let bad: Vec<_> = verdicts.iter().filter(|v| v["ok"] != true).collect();
    assert!(bad.is_empty(), "{what} rejects: {bad:#?}");
    assert!(!verdicts.is_empty());
}

/// Validates `items` with the Python SDK's types and, where Node.js is set up, the
/// TypeScript SDK's schemas.
pub(crate) async fn validate_all(items: &[Value]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("messages.json");
    std::fs::write(&file, serde_json::to_vec(items).unwrap()).unwrap();
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    if let Some(py) = python() {
        validate(&py, &tests.join("py/validate.py"), &file, "the Python SDK").await;
    }
    if node() {
        let script = node_dir().join("validate.mjs");
        validate(Path::new("node"), &script, &file, "the TypeScript SDK").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_oncely_writes_validates_for_the_negotiated_revision() {
    let received = Received::default();
    let mut config = config(&failing_upstream(received).await);
    config.max_response = 1000;
    let gw = Gateway::start(config).await;
    let mut items = Vec::new();
    for era in [LEGACY, MODERN] {
        messages(&gw, era, &mut items).await;
    }
    // A result stored in one era and replayed in the other.
    let ok = json!({"mode": "ok", "crossing": true});
    send(&gw, MODERN, 1, "render", &ok).await;
    let crossed = send(&gw, LEGACY, 2, "render", &ok).await;
    items.push(item(
        "replayed across eras",
        LEGACY,
        "tool_result",
        &crossed,
    ));
    let ok = json!({"mode": "ok", "crossing": "back"});
    send(&gw, LEGACY, 1, "render", &ok).await;
    let crossed = send(&gw, MODERN, 2, "render", &ok).await;
    items.push(item(
        "replayed across eras",
        MODERN,
        "tool_result",
        &crossed,
    ));

    for i in &items {
        let result = &i["message"]["result"];
        if i["era"] == MODERN && result.is_object() {
            assert_eq!(result["resultType"], "complete", "{i}");
        }
        if i["era"] == LEGACY {
            assert!(result.get("resultType").is_none(), "{i}");
        }
    }
    validate_all(&items).await;
}

/// The endpoint config of these tests: `charge_*` tools are actions.
fn config(upstream: &str) -> oncely_mcp::McpConfig {
    oncely_mcp::McpConfig::new("/mcp", upstream)
        .unwrap()
        .with_actions(&["charge_*".into()])
        .unwrap()
        .with_duration("timeout", "3s")
        .unwrap()
        .with_duration("wait", "500ms")
        .unwrap()
}
