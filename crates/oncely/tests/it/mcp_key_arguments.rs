//! A tool whose `idempotency_key` argument the model fills in anew on each call (the tool's
//! description asks for a unique key per request): the argument is not part of the call's
//! key, and the server receives in it the record's key in the UUID layout, the same on
//! every attempt, so two calls that differ only in the made-up key run once. Against a
//! server written with the official Python SDK (`tests/py/pay_server.py`), over stdio
//! (`oncely mcp -- COMMAND`) and an `[[mcp]]` endpoint.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

use crate::common::{post, Gateway};
use crate::mcp_remote::Raw;
use crate::mcp_tasks::mcp_tests;

fn pay(id: i64, key: &str, note: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "pay",
        "arguments": {"amount": 100, "to": "bob", "note": note, "idempotency_key": key}}})
}

fn pay_short(id: i64, key: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "pay_short",
        "arguments": {"amount": 5, "idempotency_key": key}}})
}

fn list(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"})
}

/// The executions the server logged, of `tool`.
fn executions(log: &Path, tool: &str) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "start" && e["tool"] == tool)
        .collect()
}

fn is_uuid_v8(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 36
        && [8, 13, 18, 23].iter().all(|i| b[*i] == b'-')
        && b[14] == b'8'
        && text.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
}

fn stdio_guard(python: &Path, dir: &Path, extra: &[&str]) -> Raw {
    let store = format!("sqlite://{}", dir.join("mcp.db").display());
    let log = dir.join("executions.jsonl");
    let server = mcp_tests().join("py/pay_server.py");
    let mut args: Vec<std::ffi::OsString> = vec![
        "oncely".into(),
        "mcp".into(),
        "--store".into(),
        store.into(),
    ];
    args.extend(extra.iter().map(Into::into));
    args.extend([
        "--".into(),
        python.as_os_str().to_owned(),
        server.into_os_string(),
        "--log".into(),
        log.into_os_string(),
    ]);
    let mut raw = Raw::start(&args);
    raw.initialize_as("2025-11-25");
    raw
}

#[test]
fn over_stdio_a_made_up_key_is_one_call_and_the_server_sees_one_derived_uuid() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("executions.jsonl");
    let mut raw = stdio_guard(&python, dir.path(), &[]);
    raw.send(&list(1));
    assert!(raw.response(1)["result"]["tools"].is_array());
    raw.send(&pay(2, "11111111-1111-4111-8111-111111111111", "rent"));
    let first = raw.response(2);
    assert_eq!(
        first["result"]["content"][0]["text"], "paid 100 to bob #1",
        "{first}"
    );
    raw.send(&pay(3, "22222222-2222-4222-8222-222222222222", "rent"));
    let again = raw.response(3);
    assert_eq!(
        again["result"]["content"][0]["text"], "paid 100 to bob #1",
        "{again}"
    );
    assert_eq!(
        again["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed"
    );
    // Another note is another intention (the note is an argument like any other).
    raw.send(&pay(
        4,
        "33333333-3333-4333-8333-333333333333",
        "rent for May",
    ));
    let other = raw.response(4);
    assert_eq!(
        other["result"]["content"][0]["text"], "paid 100 to bob #2",
        "{other}"
    );
    let runs = executions(&log, "pay");
    assert_eq!(runs.len(), 2, "{runs:?}");
    let key = runs[0]["idempotency_key"].as_str().unwrap();
    assert!(
        is_uuid_v8(key),
        "the server got the record's key, not the model's: {key}"
    );
    assert_ne!(key, "11111111-1111-4111-8111-111111111111");
    assert_ne!(
        runs[1]["idempotency_key"], runs[0]["idempotency_key"],
        "each record its own"
    );

    // A key whose schema rules a UUID out (maxLength 16) is forwarded as sent, and still
    // not part of the call's key.
    raw.send(&pay_short(5, "short-1"));
    assert_eq!(raw.response(5)["result"]["content"][0]["text"], "paid 5 #1");
    raw.send(&pay_short(6, "short-2"));
    let short_again = raw.response(6);
    assert_eq!(
        short_again["result"]["_meta"]["dev.oncely/replay"]["status"], "replayed",
        "{short_again}"
    );
    let short = executions(&log, "pay_short");
    assert_eq!(short.len(), 1);
    assert_eq!(short[0]["idempotency_key"], "short-1");
    assert_eq!(raw.finish().0, Some(0), "{}", raw.stderr());
}

#[test]
fn over_stdio_key_arguments_off_keys_the_call_by_the_model_s_key() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("oncely.toml"),
        "[mcp_stdio]\nkey_arguments = []\n",
    )
    .unwrap();
    let cfg = dir.path().join("oncely.toml");
    let mut raw = stdio_guard(&python, dir.path(), &["--config", cfg.to_str().unwrap()]);
    raw.send(&pay(1, "k-1", "rent"));
    assert_eq!(
        raw.response(1)["result"]["content"][0]["text"],
        "paid 100 to bob #1"
    );
    raw.send(&pay(2, "k-2", "rent"));
    assert_eq!(
        raw.response(2)["result"]["content"][0]["text"],
        "paid 100 to bob #2"
    );
    let runs = executions(&dir.path().join("executions.jsonl"), "pay");
    assert_eq!(runs.len(), 2);
    assert_eq!(
        runs[0]["idempotency_key"], "k-1",
        "forwarded as the model sent it"
    );
    assert_eq!(raw.finish().0, Some(0), "{}", raw.stderr());
}

/// The server over HTTP; killed on drop.
struct PayServer(Child, u16);

impl PayServer {
    fn start(python: &PathBuf, log: &Path) -> PayServer {
        let mut child = Command::new(python)
            .arg(mcp_tests().join("py/pay_server.py"))
            .args(["--http", "--log"])
            .arg(log)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pay_server.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next().expect("pay_server.py exited").unwrap();
        let port = line.strip_prefix("PORT ").unwrap().parse().unwrap();
        std::thread::spawn(move || for _ in lines {});
        PayServer(child, port)
    }
}

impl Drop for PayServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The JSON-RPC response in an answer (JSON, or the event stream's response).
fn message_of(text: &str) -> Value {
    serde_json::from_str::<Value>(text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|m| m.get("id").is_some() && m.get("method").is_none())
            .unwrap_or_else(|| panic!("no response in {text}"))
    })
}

async fn session(url: &str, auth: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let h = [
        ("authorization", auth),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    let a = post(url, &init.to_string(), &h).await;
    assert_eq!(a.status, 200, "{}", a.text());
    a.header("mcp-session-id").to_string()
}

async fn send(url: &str, auth: &str, sid: &str, m: &Value) -> Value {
    let h = [
        ("authorization", auth),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2025-11-25"),
        ("mcp-session-id", sid),
    ];
    message_of(&post(url, &m.to_string(), &h).await.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_endpoint_keys_a_call_without_the_made_up_key_and_each_principal_gets_its_own() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("executions.jsonl");
    let server = PayServer::start(&python, &log);
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!("store = \"{store}\"\n[[mcp]]\npath = \"/mcp\"\nupstream = \"http://127.0.0.1:{}/mcp\"\n", server.1),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", cfg.to_str().unwrap()], &[]);
    let url = gw.url("/mcp");
    let (alice, bob) = ("Bearer sk_alice", "Bearer sk_bob");
    let (sa, sb) = (session(&url, alice).await, session(&url, bob).await);
    for (i, key) in ["a-1", "a-2", "a-3"].iter().enumerate() {
        let r = send(&url, alice, &sa, &pay(10 + i as i64, key, "rent")).await;
        assert_eq!(
            r["result"]["content"][0]["text"], "paid 100 to bob #1",
            "{r}"
        );
    }
    // A retry under a key the model made up before counts no more.
    let again = send(&url, alice, &sa, &pay(13, "a-2", "rent")).await;
    assert_eq!(
        again["result"]["content"][0]["text"], "paid 100 to bob #1",
        "{again}"
    );
    // Each key made up for a retry, counted once: a-2 and a-3.
    let metrics = crate::common::get(&gw.admin_url("/metrics"), &[])
        .await
        .text();
    let churned: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("oncely_key_churn_total") && l.contains("tool=\"pay\""))
        .collect();
    assert_eq!(churned.len(), 1, "{metrics}");
    assert!(churned[0].ends_with(" 2"), "{}", churned[0]);
    let b = send(&url, bob, &sb, &pay(20, "a-1", "rent")).await;
    assert_eq!(
        b["result"]["content"][0]["text"], "paid 100 to bob #2",
        "{b}"
    );
    let runs = executions(&log, "pay");
    assert_eq!(runs.len(), 2, "one execution per principal: {runs:?}");
    let (ka, kb) = (
        runs[0]["idempotency_key"].as_str().unwrap(),
        runs[1]["idempotency_key"].as_str().unwrap(),
    );
    assert!(is_uuid_v8(ka) && is_uuid_v8(kb), "{ka} {kb}");
    assert_ne!(ka, kb, "two principals, two keys");
}

/// `intent` keys a tool's calls by the arguments it names alone: a model that rewords
/// the note of the same payment sends the same call; another amount is another.
#[test]
fn over_stdio_intent_keys_a_call_by_the_named_arguments_alone() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        "[mcp_stdio]\nintent = { \"pay\" = [\"/amount\", \"/to\"] }\n",
    )
    .unwrap();
    let mut raw = stdio_guard(&python, dir.path(), &["--config", cfg.to_str().unwrap()]);
    raw.send(&pay(1, "k-1", "rent"));
    assert_eq!(
        raw.response(1)["result"]["content"][0]["text"],
        "paid 100 to bob #1"
    );
    raw.send(&pay(2, "k-2", "rent for May, as we agreed"));
    let reworded = raw.response(2);
    assert_eq!(
        reworded["result"]["content"][0]["text"], "paid 100 to bob #1",
        "{reworded}"
    );
    assert_eq!(
        reworded["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed"
    );
    let mut more = pay(3, "k-3", "rent");
    more["params"]["arguments"]["amount"] = json!(200);
    raw.send(&more);
    assert_eq!(
        raw.response(3)["result"]["content"][0]["text"],
        "paid 200 to bob #2"
    );
    assert_eq!(
        executions(&dir.path().join("executions.jsonl"), "pay").len(),
        2
    );
    assert_eq!(raw.finish().0, Some(0), "{}", raw.stderr());
}
