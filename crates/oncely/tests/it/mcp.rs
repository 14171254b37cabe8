//! `[[mcp]]` through the real binary: `oncely serve --config` with an MCP endpoint in
//! front of the slow paid tool server of oncely-mcp's tests (the official Python MCP SDK),
//! a retried `tools/call` that executes once, and the ledger and usage commands reading
//! the MCP record.
//!
//! Needs `crates/oncely-mcp/tests/setup.sh` (the venv with `mcp`); without it the test says
//! so and passes, except under `CI`, where it fails.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::{json, Value};

use crate::common::{run, send, stderr, stdout, Gateway};

fn mcp_tests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../oncely-mcp/tests")
}

/// The Python with the official MCP SDK (from `crates/oncely-mcp/tests/setup.sh`), shared
/// by every test here that starts an MCP server.
pub(crate) fn python() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let found = [
        std::env::var_os("ONCELY_MCP_PYTHON").map(PathBuf::from),
        Some(target.join("mcp-venv/bin/python")),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.exists());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the MCP test needs crates/oncely-mcp/tests/setup.sh"
        );
        eprintln!("SKIPPED: run crates/oncely-mcp/tests/setup.sh to run the MCP test");
    }
    found
}

/// The Python SDK's slow paid server; killed on drop.
struct PaidServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl PaidServer {
    fn start(python: &PathBuf, dir: &std::path::Path, delay: f64) -> PaidServer {
        let log = dir.join("executions.jsonl");
        let mut child = Command::new(python)
            .arg(mcp_tests_dir().join("py/paid_server.py"))
            .arg("--log")
            .arg(&log)
            .arg("--delay")
            .arg(delay.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start paid_server.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = loop {
            let line = lines.next().expect("paid_server.py exited").unwrap();
            if let Some(p) = line.strip_prefix("PORT ") {
                break p.trim().parse::<u16>().unwrap();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        PaidServer { child, port, log }
    }

    fn starts(&self, tool: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["tool"] == tool && v["event"] == "start")
            .count()
    }
}

impl Drop for PaidServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Posts one JSON-RPC message; returns the session id and the messages answered (JSON or
/// an event stream).
async fn post(url: &str, session: Option<&str>, message: Value) -> (Option<String>, Vec<Value>) {
    let mut req = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", "Bearer sk_alice")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    let answer = send(
        req.body(Full::new(Bytes::from(message.to_string())))
            .unwrap(),
    )
    .await;
    assert!(
        answer.status.is_success(),
        "{}: {}",
        answer.status,
        answer.text()
    );
    let session = answer
        .headers
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    let text = answer.text();
    let messages = if text.trim_start().starts_with('{') {
        vec![serde_json::from_str(&text).unwrap()]
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    };
    (session, messages)
}

fn response(messages: &[Value], id: i64) -> Value {
    messages
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no response {id} in {messages:?}"))
        .clone()
}

fn render(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "render", "arguments": {"text": "chapter one"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_tools_call_executes_once_and_the_ledger_shows_it() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = PaidServer::start(&py, dir.path(), 1.0);
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let config = dir.path().join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            r#"store = "{store}"

[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:{port}/mcp"
principal = "header:authorization"
tools = ["*"]
window = "1h"
wait = "10s"
"#,
            port = server.port
        ),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", config.to_str().unwrap()], &[]);
    let url = gw.url("/mcp");

    let (session, init) = post(
        &url,
        None,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "e2e", "version": "0"}}}),
    )
    .await;
    assert!(
        response(&init, 0)["result"]["serverInfo"].is_object(),
        "{init:?}"
    );
    let session = session.expect("the server opens a session");
    post(
        &url,
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    // tools/list passes through.
    let (_, listed) = post(
        &url,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await;
    assert!(response(&listed, 1)["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "render"));

    // The agent's call and its impatient retry, at once; then one more retry later.
    let (first, retry) = tokio::join!(post(&url, Some(&session), render(2)), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        post(&url, Some(&session), render(3)).await
    });
    let first = response(&first.1, 2);
    let retry = response(&retry.1, 3);
    let text = |m: &Value| {
        m["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(text(&first).contains("render #1"), "{first}");
    assert_eq!(
        text(&retry),
        text(&first),
        "the retry gets the original's result"
    );
    assert_eq!(
        retry["result"]["_meta"]["dev.oncely/replay"]["status"],
        "joined"
    );
    let (_, later) = post(&url, Some(&session), render(4)).await;
    let later = response(&later, 4);
    assert_eq!(
        later["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed"
    );
    assert_eq!(server.starts("render"), 1, "the paid tool ran once");

    assert_eq!(gw.terminate().code(), Some(0));

    let list = run(&["ledger", "list", "--json", "--store", &store]);
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    let list: Value = serde_json::from_str(&stdout(&list)).unwrap();
    let records = list.as_array().unwrap();
    assert_eq!(records.len(), 1, "{list}");
    let record = &records[0];
    assert_eq!(record["route"], "/mcp#render");
    assert_eq!(record["state"], "completed");
    assert_eq!(record["units"], 1);
    assert_eq!(record["repeats"], 2);
    let by_route = run(&[
        "ledger",
        "list",
        "--json",
        "--route",
        "/mcp#render",
        "--store",
        &store,
    ]);
    let by_route: Value = serde_json::from_str(&stdout(&by_route)).unwrap();
    assert_eq!(by_route.as_array().unwrap().len(), 1, "{by_route}");
    let mine = run(&[
        "ledger",
        "list",
        "--json",
        "--principal",
        "Bearer sk_alice",
        "--store",
        &store,
    ]);
    let mine: Value = serde_json::from_str(&stdout(&mine)).unwrap();
    assert_eq!(
        mine.as_array().unwrap().len(),
        1,
        "one account, one principal: {mine}"
    );

    let id = record["id"].as_str().unwrap();
    let show = run(&["ledger", "show", id, "--json", "--store", &store]);
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    let show: Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(show["route"], "/mcp#render");
    assert!(
        show.to_string().contains("render #1"),
        "the stored tool result: {show}"
    );

    let usage = run(&["usage", "--json", "--store", &store]);
    assert_eq!(usage.status.code(), Some(0), "{}", stderr(&usage));
    let usage: Value = serde_json::from_str(&stdout(&usage)).unwrap();
    assert_eq!(
        usage["totals"],
        json!({"fresh": 1, "fresh_units": 1, "repeats": 2, "repeat_units": 2}),
        "{usage}"
    );
}

/// Runs the official Python MCP client (tests/py/client.py of oncely-mcp) with `plan`.
async fn py_client(python: &PathBuf, url: &str, plan: Value) -> Value {
    let out = tokio::process::Command::new(python)
        .arg(mcp_tests_dir().join("py/client.py"))
        .arg(url)
        .arg("legacy")
        .arg(plan.to_string())
        .env("MCP_AUTH", "Bearer sk_alice")
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run client.py");
    assert!(out.status.success(), "client.py failed: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Issue 12 (1), through the binary: a 2025-11-25 client gives up on a 2 s paid call after
/// 0.5 s, cancels it and ends its session; a new session retries. The paid tool runs once,
/// the retry gets its result with the replay `_meta`, and the ledger shows it completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_mid_call_neither_aborts_it_nor_pays_twice() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = PaidServer::start(&py, dir.path(), 2.0);
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let config = dir.path().join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            r#"store = "{store}"

[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:{port}/mcp"
wait = "10s"
timeout = "20s"
"#,
            port = server.port
        ),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", config.to_str().unwrap()], &[]);
    let url = gw.url("/mcp");
    let args = json!({"text": "chapter three"});
    let gave_up = py_client(
        &py,
        &url,
        json!([{"call": "render", "args": args, "timeout": 0.5}]),
    )
    .await;
    assert_eq!(gave_up["steps"][0]["error"]["kind"], "timeout", "{gave_up}");
    let retry = py_client(&py, &url, json!([{"call": "render", "args": args}])).await;
    let step = &retry["steps"][0]["result"];
    assert!(
        step["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("render #1")),
        "{retry}"
    );
    let replay = step["_meta"]["dev.oncely/replay"]["status"].as_str();
    assert!(
        matches!(replay, Some("joined" | "replayed")),
        "the retry gets the replay _meta: {retry}"
    );
    assert_eq!(gw.terminate().code(), Some(0));
    assert_eq!(server.starts("render"), 1, "the paid tool ran once");
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains("\"cancelled\""), "never aborted: {log}");

    let list = run(&["ledger", "list", "--json", "--store", &store]);
    let list: Value = serde_json::from_str(&stdout(&list)).unwrap();
    let records = list.as_array().unwrap();
    assert_eq!(records.len(), 1, "{list}");
    assert_eq!(records[0]["state"], "completed", "{list}");
}
