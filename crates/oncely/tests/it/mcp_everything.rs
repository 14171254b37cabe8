//! The official MCP reference server (`@modelcontextprotocol/server-everything`, pinned in
//! oncely-mcp's `tests/node/package.json`) behind `oncely mcp --url` and an `[[mcp]]`
//! endpoint of `oncely serve`, as users put it there:
//! - it marks `trigger-long-running-operation` `readOnlyHint`: a tool the operator names
//!   is guarded all the same (the annotation is an untrusted hint), and the log says so;
//! - restarted, it answers a request of the session it forgot with **400** "Bad Request:
//!   No valid session ID provided" (not the 404 the transport specifies): the `[[mcp]]`
//!   client gets the 404 it re-initialises on, and `oncely mcp --url` starts a new session
//!   by itself.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{post, Gateway};
use crate::mcp_remote::Raw;
use crate::mcp_tasks::{mcp_tests, node};

const LONG: &str = "trigger-long-running-operation";
const ALICE: (&str, &str) = ("authorization", "Bearer sk_alice");

/// server-everything over Streamable HTTP on `port`; killed on drop.
struct Everything {
    child: Child,
    port: u16,
}

impl Everything {
    fn start() -> Everything {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Everything::start_on(port)
    }

    fn start_on(port: u16) -> Everything {
        let entry = mcp_tests()
            .join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
        let mut child = Command::new("node")
            .arg(entry)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start server-everything");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("server-everything exited").unwrap();
            if line.contains("listening on port") {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Everything { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Stops it and starts it again on the same port: it forgets every session.
    fn restart(self) -> Everything {
        let port = self.port;
        drop(self);
        Everything::start_on(port)
    }
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The JSON-RPC message of an answer: its JSON body, or the first `data:` event of an
/// event stream that holds a response.
fn message_of(text: &str) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m.get("id").is_some() && m.get("method").is_none())
        .unwrap_or_else(|| panic!("no response in {text}"))
}

/// One client session through an `[[mcp]]` endpoint, as the SDKs speak it.
struct Session<'a> {
    url: &'a str,
    id: Option<String>,
}

/// The tool named `name` in a `tools/list` response.
fn listed_tool(list: &Value, name: &str) -> Value {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("the server lists {name}: {list}"))
}

impl<'a> Session<'a> {
    /// A session initialised at `url`.
    async fn open(url: &'a str) -> Session<'a> {
        let mut session = Session { url, id: None };
        session.initialize().await;
        session
    }

    /// The server's tools, listed in this session (request id 1).
    async fn list(&self) -> Value {
        let listed = self
            .send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .await;
        message_of(&listed.text())
    }

    async fn send(&self, message: &Value) -> crate::common::Answer {
        let mut headers = vec![
            ALICE,
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-06-18"),
        ];
        if let Some(id) = &self.id {
            headers.push(("mcp-session-id", id.as_str()));
        }
        post(self.url, &message.to_string(), &headers).await
    }

    async fn initialize(&mut self) {
        self.id = None;
        let init = self
            .send(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"}}}))
            .await;
        assert_eq!(init.status, 200, "{}", init.text());
        self.id = Some(init.header("mcp-session-id").to_string());
        let done = self
            .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(done.status, 202, "{}", done.text());
    }
}

/// `oncely serve` with one `[[mcp]]` endpoint at `/mcp` before `server` (its table ending
/// with `extra`), on a fresh SQLite ledger: the gateway, its directory and its store.
fn gateway(server: &Everything, extra: &str) -> (Gateway, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = dir.path().join("oncely.toml");
    let up = server.url();
    std::fs::write(
        &cfg,
        format!("store = \"{store}\"\n[[mcp]]\npath = \"/mcp\"\nupstream = \"{up}\"\n{extra}\n"),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", cfg.to_str().unwrap()], &[]);
    (gw, dir, store)
}

fn long_call(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": LONG, "arguments": {"duration": 1, "steps": 1}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_endpoint_guards_a_named_read_only_tool_and_a_forgotten_session_is_a_404() {
    if !node() {
        return;
    }
    let server = Everything::start();
    let (gw, _dir, _store) = gateway(&server, &format!("tools = [\"{LONG}\"]"));
    let url = gw.url("/mcp");
    let mut session = Session::open(&url).await;
    let long = listed_tool(&session.list().await, LONG);
    assert_eq!(long["annotations"]["readOnlyHint"], true, "{long}");

    // Named: guarded though the server calls it read-only.
    let first = session.send(&long_call(2)).await;
    assert_eq!(first.header("oncely-status"), "fresh", "{}", first.text());
    let again = session.send(&long_call(3)).await;
    assert_eq!(
        again.header("oncely-status"),
        "replayed",
        "{}",
        again.text()
    );
    assert_eq!(
        message_of(&again.text())["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed"
    );
    let log = gw.lines.lock().unwrap().join("\n");
    assert!(
        log.contains("readOnlyHint") && log.contains(LONG),
        "the log names the overruled hint: {log}"
    );

    // The server restarts and forgets the session: the client gets 404, as the transport
    // says, re-initialises, and goes on.
    let _server = server.restart();
    let stale = session
        .send(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}))
        .await;
    assert_eq!(stale.status, 404, "{}", stale.text());
    session.initialize().await;
    let listed = session
        .send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
        .await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert!(message_of(&listed.text())["result"]["tools"].is_array());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oncely_mcp_url_guards_a_named_read_only_tool_and_renews_a_forgotten_session() {
    if !node() {
        return;
    }
    let server = Everything::start();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("mcp.db").display());
    let wrapped: Vec<std::ffi::OsString> = [
        "oncely",
        "mcp",
        "--store",
        &store,
        "--tool",
        LONG,
        "--url",
        &server.url(),
    ]
    .iter()
    .map(Into::into)
    .collect();
    let mut raw = Raw::start(&wrapped);
    raw.initialize_as("2025-06-18");
    raw.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
    assert!(raw.response(1)["result"]["tools"].is_array());
    raw.send(&long_call(2));
    let first = raw.response(2);
    assert!(first["result"]["content"].is_array(), "{first}");
    assert!(
        first["result"]["_meta"]["dev.oncely/replay"].is_null(),
        "{first}"
    );
    raw.send(&long_call(3));
    let again = raw.response(3);
    assert_eq!(
        again["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed",
        "{again}\n{}",
        raw.stderr()
    );
    assert!(
        raw.stderr().contains("readOnlyHint"),
        "the log names the overruled hint: {}",
        raw.stderr()
    );

    let _server = server.restart();
    raw.send(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}));
    let listed = raw.response(4);
    assert!(
        listed["result"]["tools"].is_array(),
        "a new session, the request sent again: {listed}\n{}",
        raw.stderr()
    );
    // A call of another tool works in the new session too.
    raw.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "get-sum", "arguments": {"a": 2, "b": 3}}}));
    let sum = raw.response(5);
    assert!(
        sum["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains('5')),
        "{sum}"
    );
    assert_eq!(raw.finish().0, Some(0), "{}", raw.stderr());
    tokio::time::sleep(Duration::from_millis(10)).await;
}

const RESEARCH: &str = "simulate-research-query";

fn research(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": RESEARCH, "arguments": {"topic": "tides"}}})
}

/// Asserts that `message` is the research report the server's task produced, with none of
/// the server's task in it.
fn assert_report(message: &Value) {
    let text = message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("Research Report: tides"), "{message}");
    assert!(message["result"]["task"].is_null(), "{message}");
    assert!(
        message["result"]["_meta"]["io.modelcontextprotocol/related-task"].is_null(),
        "the server's task is not the client's: {message}"
    );
}

/// The states of the records in `store`.
fn states(store: &str) -> Vec<String> {
    let list = crate::common::run(&["ledger", "list", "--json", "--store", store]);
    let records: Value = serde_json::from_slice(&list.stdout).unwrap();
    records
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["state"].as_str().map(str::to_string))
        .collect()
}

/// The reference server's `simulate-research-query` runs only as a task
/// (`taskSupport: "required"`). oncely lists it as `forbidden` (it does not advertise
/// task-augmented calls of guarded tools), so the client calls it plainly, and oncely's
/// owner calls it as a task, follows the server's task on the client's session to its end
/// (about 4 s) and answers with its result: one record, a duplicate during the run joins
/// it, a later one replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_requires_a_task_is_run_as_one_and_its_result_replayed() {
    if !node() {
        return;
    }
    let server = Everything::start();
    let (gw, _dir, store) = gateway(&server, "");
    let url = gw.url("/mcp");
    let session = Session::open(&url).await;
    let tool = listed_tool(&session.list().await, RESEARCH);
    assert_eq!(tool["execution"]["taskSupport"], "forbidden", "{tool}");

    let call = research(2);
    let (first, joined) = tokio::join!(session.send(&call), async {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        session.send(&research(3)).await
    });
    assert_eq!(first.header("oncely-status"), "fresh", "{}", first.text());
    let first = message_of(&first.text());
    assert_eq!(first["id"], 2);
    assert_report(&first);
    assert_eq!(
        joined.header("oncely-status"),
        "joined",
        "{}",
        joined.text()
    );
    let joined = message_of(&joined.text());
    assert_eq!(joined["id"], 3);
    assert_eq!(joined["result"]["content"], first["result"]["content"]);
    let again = session.send(&research(4)).await;
    assert_eq!(
        again.header("oncely-status"),
        "replayed",
        "{}",
        again.text()
    );
    let again = message_of(&again.text());
    assert_eq!(again["result"]["content"], first["result"]["content"]);
    assert_eq!(
        again["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed"
    );
    assert_eq!(states(&store), ["completed"], "one execution, recorded");
    let log = gw.lines.lock().unwrap().join("\n");
    assert!(log.contains("the server runs the call as a task"), "{log}");
}

/// The same through `oncely mcp --url`: its remote link follows the server's task on its
/// session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oncely_mcp_url_runs_a_tool_that_requires_a_task_as_one() {
    if !node() {
        return;
    }
    let server = Everything::start();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("mcp.db").display());
    let wrapped: Vec<std::ffi::OsString> =
        ["oncely", "mcp", "--store", &store, "--url", &server.url()]
            .iter()
            .map(Into::into)
            .collect();
    let mut raw = Raw::start(&wrapped);
    raw.initialize_as("2025-11-25");
    raw.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
    let listed = raw.response(1);
    let tool = listed_tool(&listed, RESEARCH);
    assert_eq!(tool["execution"]["taskSupport"], "forbidden", "{tool}");
    raw.send(&research(2));
    let first = raw.response(2);
    assert_report(&first);
    assert!(
        first["result"]["_meta"]["dev.oncely/replay"].is_null(),
        "{first}"
    );
    raw.send(&research(3));
    let again = raw.response(3);
    assert_eq!(
        again["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed",
        "{again}\n{}",
        raw.stderr()
    );
    assert_eq!(again["result"]["content"], first["result"]["content"]);
    assert_eq!(raw.finish().0, Some(0), "{}", raw.stderr());
    assert_eq!(states(&store), ["completed"]);
}

/// Called before oncely saw it listed, the tool is refused by the server's SDK with a
/// protocol error (-32601) wrapped as an `isError` result. That is no result of the tool,
/// which never ran: it is not stored, and oncely learns from it that the tool runs only
/// as a task, so the next call (the client's retry) is run as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_refusal_wrapped_as_a_tool_result_is_not_stored() {
    if !node() {
        return;
    }
    let server = Everything::start();
    let (gw, _dir, store) = gateway(&server, "");
    let url = gw.url("/mcp");
    let session = Session::open(&url).await;
    let a = session.send(&research(1)).await;
    assert_eq!(a.header("oncely-status"), "fresh", "{}", a.text());
    let refused = message_of(&a.text());
    let text = refused["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("-32601"),
        "the server's own refusal: {refused}"
    );
    assert!(refused["result"]["_meta"]["dev.oncely/replay"].is_null());
    assert!(
        states(&store).iter().all(|s| s != "completed"),
        "the refusal is not stored"
    );
    let retry = session.send(&research(2)).await;
    assert_eq!(retry.header("oncely-status"), "fresh", "{}", retry.text());
    assert_report(&message_of(&retry.text()));
    let again = session.send(&research(3)).await;
    assert_eq!(
        again.header("oncely-status"),
        "replayed",
        "{}",
        again.text()
    );
    assert!(states(&store).contains(&"completed".to_string()));
    let log = gw.lines.lock().unwrap().join("\n");
    assert!(log.contains("only as a task"), "{log}");
}
