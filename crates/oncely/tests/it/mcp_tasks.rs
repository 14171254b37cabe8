//! Issue 23, through the real binary: nothing a caller adds to a guarded `tools/call` takes
//! it around the guard, and the `io.modelcontextprotocol/tasks` extension to the letter.
//!
//! `oncely serve --config` runs an `[[mcp]]` endpoint in front of a paid MCP server on
//! 127.0.0.1 ([`PaidTools`]: real HTTP, JSON-RPC as written, every execution counted).
//! Every task message oncely writes is validated with the official Python SDK's wire
//! types and the extension's published JSON Schema (vendored in
//! `crates/oncely-mcp/tests/schema/`, with the commit it came from), and with the
//! TypeScript SDK's schemas. The TypeScript SDK (1.32) speaks revisions up to 2025-11-25
//! and has no tasks extension, so `tasks.mjs` drives it for 2025-11-25 and speaks the raw
//! 2026-07-28 protocol from Node for the extension.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{json, Value};

use crate::common::{post as http_post, upstream, Gateway};
use crate::mcp::python;

const LEGACY: &str = "2025-11-25";
const MODERN: &str = "2026-07-28";
const ALICE: &str = "Bearer sk_alice";
const BOB: &str = "Bearer sk_bob";

/// The paid MCP server: every `tools/call` that reaches it is an execution, counted per
/// tool and arguments (and, for a continuation, its `inputResponses`).
#[derive(Default)]
struct PaidTools {
    executions: Mutex<HashMap<String, usize>>,
    /// Every `tools/call` body it received, as written.
    calls: Mutex<Vec<String>>,
    /// Every method it was asked, in order.
    methods: Mutex<Vec<String>>,
    /// How many input requests it answered (`mode: "ask"` without input).
    asks: Mutex<usize>,
}

impl PaidTools {
    fn executions(&self, tool: &str, arguments: &Value) -> usize {
        let key = format!("{tool} {arguments}");
        self.executions
            .lock()
            .unwrap()
            .get(&key)
            .copied()
            .unwrap_or(0)
    }

    fn saw_task_param(&self) -> bool {
        self.calls.lock().unwrap().iter().any(|c| {
            serde_json::from_str::<Value>(c).is_ok_and(|v| v["params"].get("task").is_some())
        })
    }

    fn asked(&self, method: &str) -> bool {
        self.methods.lock().unwrap().iter().any(|m| m == method)
    }

    async fn answer(&self, modern: bool, message: &Value) -> Option<Value> {
        let id = message.get("id")?.clone();
        let method = message["method"].as_str().unwrap_or("");
        self.methods.lock().unwrap().push(method.to_string());
        let complete = |mut result: Value| {
            if modern {
                result["resultType"] = json!("complete");
            }
            json!({"jsonrpc": "2.0", "id": id, "result": result})
        };
        let error = |code: i64, message: &str, data: Value| json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": data}});
        Some(match method {
            "initialize" => complete(json!({
                "protocolVersion": message["params"]["protocolVersion"].as_str().unwrap_or(LEGACY),
                "capabilities": {"tools": {}, "tasks": {"requests": {"tools": {"call": {}}}}},
                "serverInfo": {"name": "paid-tools", "version": "1.0.0"},
            })),
            "server/discover" => complete(json!({
                "supportedVersions": [MODERN], "cacheScope": "public", "ttlMs": 60000,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "paid-tools", "version": "1.0.0"},
            })),
            "tools/list" => {
                let tool = |name: &str, read_only: bool| {
                    json!({"name": name, "inputSchema": {"type": "object"},
                        "annotations": {"readOnlyHint": read_only},
                        "execution": {"taskSupport": "optional"}})
                };
                complete(
                    json!({"tools": [tool("render", false), tool("book", false), tool("balance", true)]}),
                )
            }
            "tools/call" => return Some(self.call(modern, message, &id).await),
            other => error(-32601, &format!("Method not found: {other}"), Value::Null),
        })
    }

    async fn call(&self, modern: bool, message: &Value, id: &Value) -> Value {
        let params = &message["params"];
        let tool = params["name"].as_str().unwrap_or("").to_string();
        let args = params.get("arguments").cloned().unwrap_or(json!({}));
        let mode = args["mode"].as_str().unwrap_or("ok").to_string();
        let ms = args["ms"].as_u64().unwrap_or(0);
        let wrap = |mut result: Value| {
            if modern && result.get("resultType").is_none() {
                result["resultType"] = json!("complete");
            }
            json!({"jsonrpc": "2.0", "id": id, "result": result})
        };
        if mode == "ask" && params.get("inputResponses").is_none() {
            let n = {
                let mut asks = self.asks.lock().unwrap();
                *asks += 1;
                *asks
            };
            return wrap(json!({
                "resultType": "input_required",
                "inputRequests": {format!("size-{n}"): {"method": "elicitation/create", "params": {
                    "mode": "form", "message": "Which size?",
                    "requestedSchema": {"type": "object", "properties": {"size": {"type": "string"}}}}}},
                "requestState": format!("sealed-state-{n}"),
            }));
        }
        let mut key = format!("{tool} {args}");
        if let Some(responses) = params.get("inputResponses") {
            key = format!("{key} {responses}");
        }
        let n = {
            let mut executions = self.executions.lock().unwrap();
            let n = executions.entry(key).or_default();
            *n += 1;
            *n
        };
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let fail = mode == "fail" || (mode == "fail_once" && n == 1);
        if fail {
            return json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000,
                "message": "quota exceeded", "data": {"tool": tool, "execution": n}}});
        }
        if params.get("task").is_some() {
            // A server that honoured the task parameter would answer a task of its own.
            return wrap(
                json!({"task": {"taskId": format!("server-task-{n}"), "status": "working",
                "createdAt": "2026-12-01T00:00:00Z", "lastUpdatedAt": "2026-12-01T00:00:00Z", "ttl": 60000}}),
            );
        }
        let text = match params.get("inputResponses") {
            Some(r) => format!("{tool} run #{n} with {r}"),
            None => format!("{tool} run #{n}"),
        };
        wrap(json!({"content": [{"type": "text", "text": text}]}))
    }
}

async fn serve_mcp(
    State(paid): State<Arc<PaidTools>>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    let modern = headers
        .get("mcp-protocol-version")
        .is_some_and(|v| v == MODERN);
    let message: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    if message["method"] == "tools/call" {
        paid.calls.lock().unwrap().push(body.clone());
    }
    match paid.answer(modern, &message).await {
        Some(answer) => {
            ([("content-type", "application/json")], answer.to_string()).into_response()
        }
        None => StatusCode::ACCEPTED.into_response(),
    }
}

async fn start_paid() -> (Arc<PaidTools>, u16) {
    let paid = Arc::new(PaidTools::default());
    let router = axum::Router::new()
        .route(
            "/mcp",
            post(serve_mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }),
        )
        .with_state(paid.clone());
    (paid, upstream(router).await.port())
}

fn gateway(dir: &Path, port: u16) -> Gateway {
    let config = dir.join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            r#"store = "sqlite://{}"

[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:{port}/mcp"
window = "1h"
wait = "500ms"
timeout = "20s"
"#,
            dir.join("ledger.db").display()
        ),
    )
    .unwrap();
    Gateway::start(&["--config", config.to_str().unwrap()], &[])
}

/// A paid server and a gateway in front of it, with its ledger in `dir`.
struct Setup {
    dir: tempfile::TempDir,
    paid: Arc<PaidTools>,
    port: u16,
    gw: Gateway,
}

impl Setup {
    async fn start() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let (paid, port) = start_paid().await;
        let gw = gateway(dir.path(), port);
        Setup {
            dir,
            paid,
            port,
            gw,
        }
    }
}

/// A client of one revision and principal; `tasks`: it declares the extension (2026-07-28).
#[derive(Clone, Copy)]
struct Client<'a> {
    url: &'a str,
    era: &'a str,
    auth: &'a str,
    tasks: bool,
}

impl Client<'_> {
    fn modern<'a>(url: &'a str, auth: &'a str) -> Client<'a> {
        Client {
            url,
            era: MODERN,
            auth,
            tasks: true,
        }
    }

    /// `params` with the request `_meta` of a 2026-07-28 client.
    fn params(&self, mut params: Value) -> Value {
        if self.era == MODERN {
            let meta = params
                .as_object_mut()
                .unwrap()
                .entry("_meta")
                .or_insert(json!({}));
            meta["io.modelcontextprotocol/protocolVersion"] = json!(MODERN);
            let extensions = if self.tasks {
                json!({"io.modelcontextprotocol/tasks": {}})
            } else {
                json!({})
            };
            meta["io.modelcontextprotocol/clientCapabilities"] = json!({"extensions": extensions});
        }
        params
    }

    /// Sends a request as written, with these routing headers; the HTTP status and the
    /// JSON-RPC answer.
    async fn send(&self, body: &str, headers: &[(&str, &str)]) -> (u16, Value) {
        let mut all = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", self.era),
            ("authorization", self.auth),
        ];
        all.extend_from_slice(headers);
        let answer = http_post(self.url, body, &all).await;
        let text = answer.text();
        let value = serde_json::from_str(&text).unwrap_or_else(|_| {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .find_map(|d| serde_json::from_str(d.trim()).ok())
                .unwrap_or_else(|| json!({"http_status": answer.status.as_u16(), "text": text}))
        });
        (answer.status.as_u16(), value)
    }

    /// A request of `method` with `params` (made this client's), `name` its `Mcp-Name`.
    async fn request(&self, id: u64, method: &str, name: &str, params: Value) -> Value {
        let message =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": self.params(params)});
        self.send(
            &message.to_string(),
            &[("mcp-method", method), ("mcp-name", name)],
        )
        .await
        .1
    }

    async fn call(&self, id: u64, tool: &str, arguments: &Value) -> Value {
        let params = json!({"name": tool, "arguments": arguments});
        self.request(id, "tools/call", tool, params).await
    }

    async fn task(&self, id: u64, method: &str, task_id: &str) -> Value {
        self.request(id, method, task_id, json!({"taskId": task_id}))
            .await
    }
}

fn replay_status(answer: &Value) -> Option<&str> {
    answer["result"]["_meta"]["dev.oncely/replay"]["status"].as_str()
}

fn text(answer: &Value) -> &str {
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no tool result text in {answer}"))
}

/// One message to validate (see crates/oncely-mcp/tests/py/validate.py).
fn item(name: &str, era: &str, kind: &str, message: &Value) -> Value {
    json!({"name": name, "era": era, "kind": kind, "message": message})
}

pub(crate) fn mcp_tests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../oncely-mcp/tests")
}

/// True when Node.js and the TypeScript SDK are installed (else skipped, and under CI a
/// failure).
pub(crate) fn node() -> bool {
    let ok = mcp_tests()
        .join("node/node_modules/@modelcontextprotocol/sdk")
        .exists()
        && std::process::Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "the TypeScript SDK test needs Node.js and crates/oncely-mcp/tests/setup.sh"
        );
        eprintln!("SKIPPED: install Node.js and run crates/oncely-mcp/tests/setup.sh");
    }
    ok
}

/// Validates `items` with the Python SDK's wire types and the extension's JSON Schema,
/// and with the TypeScript SDK's schemas; every message must pass.
fn validate(python: &Path, items: &[Value]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("messages.json");
    std::fs::write(&file, serde_json::to_vec(items).unwrap()).unwrap();
    let mut validators = vec![(python.to_path_buf(), mcp_tests().join("py/validate.py"))];
    if node() {
        validators.push((PathBuf::from("node"), mcp_tests().join("node/validate.mjs")));
    }
    for (program, script) in validators {
        let out = std::process::Command::new(&program)
            .arg(&script)
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let verdicts: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(verdicts.len(), items.len());
        let bad: Vec<_> = verdicts.iter().filter(|v| v["ok"] != true).collect();
        assert!(bad.is_empty(), "{script:?} rejects: {bad:#?}");
    }
}

/// Polls `tasks/get` until the task leaves `working`.
async fn until_done(client: &Client<'_>, task_id: &str) -> Value {
    for i in 0..200 {
        let got = client.task(1000 + i, "tasks/get", task_id).await;
        if got["result"]["status"] != "working" {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("task {task_id} still working after 20 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_parameter_never_takes_a_guarded_call_around_the_guard() {
    let Some(py) = python() else { return };
    let Setup {
        dir: _dir,
        paid,
        port: _port,
        gw,
    } = Setup::start().await;
    let url = gw.url("/mcp");
    let mut items = Vec::new();
    for era in [LEGACY, MODERN] {
        let client = Client {
            url: &url,
            era,
            auth: ALICE,
            tasks: era == MODERN,
        };
        let args = json!({"mode": "ok", "era": era});
        let with_task = |id: u64| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": client.params(json!({"name": "render", "arguments": args, "task": {"ttl": 60000}}))})
        };
        let headers = [("mcp-method", "tools/call"), ("mcp-name", "render")];
        // With, without, and with again: one execution, the first of the three.
        let (_, first) = client.send(&with_task(1).to_string(), &headers).await;
        assert_eq!(text(&first), "render run #1", "{era}: {first}");
        assert_eq!(replay_status(&first), None, "fresh: {first}");
        let plain = client.call(2, "render", &args).await;
        assert_eq!(replay_status(&plain), Some("replayed"), "{era}: {plain}");
        let (_, again) = client.send(&with_task(3).to_string(), &headers).await;
        assert_eq!(replay_status(&again), Some("replayed"), "{era}: {again}");
        assert_eq!(text(&again), "render run #1");
        // Many at once, half of them task-augmented: still that one execution.
        let slow = json!({"mode": "slow", "ms": 300, "era": era});
        let answers = futures::future::join_all((0..12u64).map(|i| {
            let slow = slow.clone();
            async move {
                let params = if i % 2 == 0 {
                    json!({"name": "render", "arguments": slow, "task": {"ttl": 1000}})
                } else {
                    json!({"name": "render", "arguments": slow})
                };
                let message = json!({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                    "params": client.params(params)});
                client.send(&message.to_string(), &headers).await.1
            }
        }))
        .await;
        for a in &answers {
            assert_eq!(text(a), "render run #1", "{era}: {a}");
        }
        assert_eq!(paid.executions("render", &args), 1, "{era}");
        assert_eq!(paid.executions("render", &slow), 1, "{era}");
        items.push(item(
            "a task-augmented call, replayed",
            era,
            "tool_result",
            &again,
        ));
        if era == LEGACY {
            items.push(item(
                "a task-augmented call, fresh",
                era,
                "tool_result",
                &first,
            ));
        }
    }
    assert!(
        !paid.saw_task_param(),
        "a guarded call reached the server with its task parameter"
    );

    // 2025-11-25: guarded tools are not offered as task-augmentable; the rest is as the
    // server listed it.
    let legacy = Client {
        url: &url,
        era: LEGACY,
        auth: ALICE,
        tasks: false,
    };
    let listed = legacy.request(50, "tools/list", "", json!({})).await;
    let support = |name: &str| {
        listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["execution"]["taskSupport"].clone())
            .unwrap()
    };
    assert_eq!(support("render"), "forbidden", "{listed}");
    assert_eq!(support("book"), "forbidden");
    assert_eq!(
        support("balance"),
        "optional",
        "a read-only tool is not guarded"
    );
    validate(&py, &items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_member_a_call_carries_changes_whether_it_is_guarded() {
    if python().is_none() {
        return;
    }
    let Setup {
        dir: _dir,
        paid,
        port: _port,
        gw,
    } = Setup::start().await;
    let url = gw.url("/mcp");
    // Every member a tools/call can carry besides its name and arguments, in each
    // revision's schema (`_meta` keys, progressToken, task), and members none defines.
    let extras: Vec<(&str, Value)> = vec![
        ("progressToken", json!({"_meta": {"progressToken": "p-1"}})),
        (
            "numeric progressToken",
            json!({"_meta": {"progressToken": 7}}),
        ),
        (
            "client info",
            json!({"_meta": {"io.modelcontextprotocol/clientInfo": {"name": "x", "version": "1"}}}),
        ),
        (
            "another extension",
            json!({"_meta": {"io.modelcontextprotocol/clientCapabilities": {"extensions": {"x.example/y": {}}}}}),
        ),
        (
            "vendor meta",
            json!({"_meta": {"vendor.example/trace": "abc"}}),
        ),
        ("task", json!({"task": {"ttl": 60000}})),
        ("empty task", json!({"task": {}})),
        ("null task", json!({"task": null})),
        ("unknown member", json!({"priority": "high"})),
        ("null member", json!({"cursor": null})),
        ("array member", json!({"inputs": [1, 2, 3]})),
    ];
    for era in [LEGACY, MODERN] {
        let client = Client {
            url: &url,
            era,
            auth: ALICE,
            tasks: false,
        };
        let args = json!({"mode": "ok", "members": era});
        let first = client.call(1, "render", &args).await;
        assert_eq!(text(&first), "render run #1", "{first}");
        for (i, (what, extra)) in extras.iter().enumerate() {
            let mut params = json!({"name": "render", "arguments": args});
            for (k, v) in extra.as_object().unwrap() {
                params[k] = v.clone();
            }
            let params = client.params(params);
            // A string id and an unknown top-level member too.
            let message = json!({"jsonrpc": "2.0", "id": format!("call-{i}"), "method": "tools/call",
                "params": params, "x-extra": true});
            let (_, answer) = client
                .send(
                    &message.to_string(),
                    &[("mcp-method", "tools/call"), ("mcp-name", "render")],
                )
                .await;
            assert_eq!(
                replay_status(&answer),
                Some("replayed"),
                "{era} with {what}: {answer}"
            );
            assert_eq!(answer["id"], format!("call-{i}"));
        }
        assert_eq!(paid.executions("render", &args), 1, "{era}");

        // A spelling that is not one call to guard is refused, never forwarded unguarded.
        let calls_before = paid.calls.lock().unwrap().len();
        let params =
            client.params(json!({"name": "render", "arguments": {"mode": "ok", "odd": era}}));
        for (what, message) in [
            (
                "a null id",
                json!({"jsonrpc": "2.0", "id": null, "method": "tools/call", "params": params}),
            ),
            (
                "no id",
                json!({"jsonrpc": "2.0", "method": "tools/call", "params": params}),
            ),
            (
                "params as an array",
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ["render", {}]}),
            ),
            (
                "a numeric name",
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 7}}),
            ),
        ] {
            let (status, answer) = client
                .send(
                    &message.to_string(),
                    &[("mcp-method", "tools/call"), ("mcp-name", "render")],
                )
                .await;
            assert_eq!(status, 400, "{era} {what}: {answer}");
            assert!(answer["error"]["code"].is_i64(), "{era} {what}: {answer}");
        }
        assert_eq!(
            paid.calls.lock().unwrap().len(),
            calls_before,
            "{era}: refused calls reached the server"
        );
    }
    assert!(!paid.saw_task_param());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_is_an_intention_and_an_input_request_is_never_stored() {
    let Some(py) = python() else { return };
    let Setup {
        dir,
        paid,
        port: _port,
        gw,
    } = Setup::start().await;
    let url = gw.url("/mcp");
    let client = Client {
        url: &url,
        era: MODERN,
        auth: ALICE,
        tasks: false,
    };
    let args = json!({"mode": "ask", "item": "t-shirt"});
    // The first round asks for input: answered, never stored, so asked again.
    let ask = client.call(1, "book", &args).await;
    assert_eq!(ask["result"]["resultType"], "input_required", "{ask}");
    assert_eq!(ask["result"]["requestState"], "sealed-state-1");
    let again = client.call(2, "book", &args).await;
    assert_eq!(
        again["result"]["requestState"], "sealed-state-2",
        "the input request came from the server again, not from the ledger: {again}"
    );
    assert_eq!(*paid.asks.lock().unwrap(), 2);
    let records = crate::common::run(&[
        "ledger",
        "list",
        "--json",
        "--store",
        &format!("sqlite://{}", dir.path().join("ledger.db").display()),
    ]);
    let records: Value = serde_json::from_slice(&records.stdout).unwrap();
    assert!(
        records
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["state"] == "released"),
        "an input request is never stored: {records}"
    );

    // Identical continuations, many at once: the tool runs once.
    let continuation = |id: u64, size: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": client.params(json!({
            "name": "book", "arguments": args,
            "inputResponses": {"size-2": {"action": "accept", "content": {"size": size}}},
            "requestState": "sealed-state-2"}))})
    };
    let headers = [("mcp-method", "tools/call"), ("mcp-name", "book")];
    let answers = futures::future::join_all((0..10u64).map(|i| async move {
        client
            .send(&continuation(10 + i, "M").to_string(), &headers)
            .await
            .1
    }))
    .await;
    let fresh = answers
        .iter()
        .filter(|a| replay_status(a).is_none())
        .count();
    assert_eq!(fresh, 1, "{answers:?}");
    for a in &answers {
        assert!(text(a).starts_with("book run #1 with "), "{a}");
    }
    let responses = json!({"size-2": {"action": "accept", "content": {"size": "M"}}});
    let key = format!("book {args} {responses}");
    assert_eq!(paid.executions.lock().unwrap().get(&key).copied(), Some(1));
    // Another answer to the question is another intention.
    let (_, other) = client
        .send(&continuation(30, "L").to_string(), &headers)
        .await;
    assert_eq!(replay_status(&other), None, "{other}");
    let mut items = vec![
        item("input_required", MODERN, "input_required", &ask),
        item("continuation", MODERN, "tool_result", &answers[0]),
    ];
    if let Some(replayed) = answers.iter().find(|a| replay_status(a).is_some()) {
        items.push(item(
            "continuation replayed",
            MODERN,
            "tool_result",
            replayed,
        ));
    }
    validate(&py, &items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_task_stays_failed_with_the_servers_own_error() {
    let Some(py) = python() else { return };
    let Setup {
        dir,
        paid,
        port,
        gw,
    } = Setup::start().await;
    let url = gw.url("/mcp");
    let alice = Client::modern(&url, ALICE);
    let mut items = Vec::new();

    // Fails the first time, succeeds the next: each a task (1.2 s > wait).
    let args = json!({"mode": "fail_once", "ms": 1200});
    let created = alice.call(1, "render", &args).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let first = created["result"]["taskId"].as_str().unwrap().to_string();
    items.push(item("CreateTaskResult", MODERN, "task", &created));
    let failed = until_done(&alice, &first).await;
    assert_eq!(failed["result"]["status"], "failed", "{failed}");
    assert_eq!(
        failed["result"]["error"],
        json!({"code": -32000, "message": "quota exceeded", "data": {"tool": "render", "execution": 1}}),
        "the server's JSON-RPC error as it was: {failed}"
    );
    items.push(item("GetTaskResult failed", MODERN, "get_task", &failed));

    // The same call again is a new execution, and a new task.
    let created = alice.call(2, "render", &args).await;
    let second = created["result"]["taskId"].as_str().unwrap().to_string();
    assert_ne!(second, first, "{created}");
    let snapshot = |v: &Value| {
        let mut r = v["result"].clone();
        r.as_object_mut().unwrap().remove("_meta");
        r
    };
    let meanwhile = alice.task(3, "tasks/get", &first).await;
    assert_eq!(
        snapshot(&meanwhile),
        snapshot(&failed),
        "a failed task never changes"
    );
    let done = until_done(&alice, &second).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"],
        "render run #2"
    );
    items.push(item("GetTaskResult completed", MODERN, "get_task", &done));
    let after = alice.task(4, "tasks/get", &first).await;
    assert_eq!(
        snapshot(&after),
        snapshot(&failed),
        "nor does it once a later execution completed"
    );
    let completed = alice.task(5, "tasks/get", &second).await;
    assert_eq!(snapshot(&completed), snapshot(&done), "nor a completed one");
    assert_eq!(paid.executions("render", &args), 2);

    // A restarted gateway reads the same from the ledger.
    drop(gw);
    let gw = gateway(dir.path(), port);
    let url = gw.url("/mcp");
    let alice = Client::modern(&url, ALICE);
    let restarted = alice.task(6, "tasks/get", &first).await;
    assert_eq!(snapshot(&restarted), snapshot(&failed));
    validate(&py, &items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_requests_follow_the_extension() {
    let Some(py) = python() else { return };
    let Setup {
        dir: _dir,
        paid,
        port: _port,
        gw,
    } = Setup::start().await;
    let url = gw.url("/mcp");
    let alice = Client::modern(&url, ALICE);
    let mut items = Vec::new();

    let args = json!({"mode": "slow", "ms": 1500});
    let created = alice.call(1, "render", &args).await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_string();

    // Unknown, made up, and another principal's: -32602, the server never asked.
    let bob = Client::modern(&url, BOB);
    for (who, client, id) in [
        ("unknown", &alice, "rec_0000000000000000000000000000000"),
        ("another attempt", &alice, &format!("{task_id}.7")),
        ("another principal's", &bob, task_id.as_str()),
    ] {
        for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
            let answer = client.task(2, method, id).await;
            assert_eq!(answer["error"]["code"], -32602, "{who} {method}: {answer}");
            items.push(item(&format!("{who} {method}"), MODERN, "error", &answer));
        }
    }
    assert!(
        !paid.asked("tasks/get"),
        "a task of oncely's is never forwarded"
    );
    // A task id of the server's own is the server's; one it does not know is -32602 too.
    let server = alice.task(3, "tasks/get", "server-task-404").await;
    assert_eq!(server["error"]["code"], -32602, "{server}");
    assert!(paid.asked("tasks/get"));

    // Without the extension declared: -32021, naming it.
    let plain = Client {
        tasks: false,
        ..alice
    };
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        // Over HTTP with status 400, as the 2026-07-28 transport answers a protocol error.
        let message = json!({"jsonrpc": "2.0", "id": 4, "method": method,
            "params": plain.params(json!({"taskId": task_id}))});
        let (status, answer) = plain
            .send(
                &message.to_string(),
                &[("mcp-method", method), ("mcp-name", &task_id)],
            )
            .await;
        assert_eq!(status, 400, "{method}: {answer}");
        assert_eq!(answer["error"]["code"], -32021, "{method}: {answer}");
        assert_eq!(
            answer["error"]["data"]["requiredCapabilities"]["extensions"]
                ["io.modelcontextprotocol/tasks"],
            json!({})
        );
        items.push(item(
            &format!("undeclared {method}"),
            MODERN,
            "error",
            &answer,
        ));
    }

    // Routing headers as on tools/call: Mcp-Name is the taskId.
    let get = json!({"jsonrpc": "2.0", "id": 5, "method": "tasks/get",
        "params": alice.params(json!({"taskId": task_id}))});
    for (what, headers) in [
        ("no Mcp-Name", vec![("mcp-method", "tasks/get")]),
        ("no Mcp-Method", vec![("mcp-name", task_id.as_str())]),
        (
            "another Mcp-Name",
            vec![("mcp-method", "tasks/get"), ("mcp-name", "rec_other")],
        ),
        (
            "another Mcp-Method",
            vec![
                ("mcp-method", "tasks/cancel"),
                ("mcp-name", task_id.as_str()),
            ],
        ),
    ] {
        let (status, answer) = alice.send(&get.to_string(), &headers).await;
        assert_eq!(answer["error"]["code"], -32020, "{what}: {answer}");
        assert_eq!(status, 400, "{what}");
        items.push(item(what, MODERN, "error", &answer));
    }
    let mut other_version = get.clone();
    other_version["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] =
        json!("2025-11-25");
    let (_, answer) = alice
        .send(
            &other_version.to_string(),
            &[("mcp-method", "tasks/get"), ("mcp-name", task_id.as_str())],
        )
        .await;
    assert_eq!(answer["error"]["code"], -32020, "{answer}");

    // tasks/update is acknowledged; inputs that are not outstanding are ignored.
    let update = alice
        .request(
            6,
            "tasks/update",
            &task_id,
            json!({"taskId": task_id, "inputResponses": {"never-asked": {"action": "accept", "content": {}}}}),
        )
        .await;
    assert_eq!(
        update["result"],
        json!({"resultType": "complete"}),
        "{update}"
    );
    items.push(item("UpdateTaskResult", MODERN, "update_task", &update));

    // One client cancels; what another client of the same principal sees does not
    // depend on it, and the execution runs on.
    let cancel = alice.task(7, "tasks/cancel", &task_id).await;
    assert_eq!(cancel["result"], json!({"resultType": "complete"}));
    items.push(item("CancelTaskResult", MODERN, "cancel_task", &cancel));
    let done = until_done(&alice, &task_id).await;
    let other_client = Client::modern(&url, ALICE)
        .task(8, "tasks/get", &task_id)
        .await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(other_client["result"], done["result"]);
    assert!(!done["result"]["statusMessage"]
        .as_str()
        .unwrap()
        .contains("This client"));
    items.push(item("GetTaskResult completed", MODERN, "get_task", &done));
    assert_eq!(paid.executions("render", &args), 1);

    // server/discover advertises the extension.
    let discover = alice.request(9, "server/discover", "", json!({})).await;
    assert_eq!(
        discover["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"],
        json!({}),
        "{discover}"
    );
    assert_eq!(discover["result"]["capabilities"]["tools"], json!({}));
    items.push(item("server/discover", MODERN, "discover", &discover));
    validate(&py, &items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_and_node_see_one_execution_and_terminal_tasks() {
    let Some(py) = python() else { return };
    if !node() {
        return;
    }
    let Setup {
        dir: _dir,
        paid,
        port: _port,
        gw,
    } = Setup::start().await;
    let out = tokio::process::Command::new("node")
        .arg(mcp_tests().join("node/tasks.mjs"))
        .arg(gw.url("/mcp"))
        .env("MCP_AUTH", ALICE)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "tasks.mjs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));

    // The SDK (2025-11-25): guarded tools are offered without task augmentation, and a
    // call that asks for a task anyway runs as the plain guarded call.
    let sdk = &report["sdk"];
    assert_eq!(sdk["taskSupport"]["render"], "forbidden", "{sdk}");
    assert_eq!(sdk["taskSupport"]["balance"], "optional");
    assert_eq!(sdk["plain"]["content"][0]["text"], "render run #1", "{sdk}");
    assert_eq!(
        sdk["augmented"]["content"][0]["text"], "render run #1",
        "{sdk}"
    );
    assert_eq!(
        sdk["augmented"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed"
    );
    assert_eq!(
        sdk["stream"]["content"][0]["text"], "render run #1",
        "{sdk}"
    );
    assert_eq!(
        paid.executions("render", &json!({"mode": "ok", "by": "sdk"})),
        1
    );

    // Raw 2026-07-28 from Node: the happy path, the task parameter, a failed task.
    let raw = &report["raw"];
    assert_eq!(
        raw["happy"]["created"]["result"]["resultType"], "task",
        "{raw}"
    );
    assert_eq!(raw["happy"]["done"]["result"]["status"], "completed");
    assert_eq!(
        paid.executions("render", &json!({"mode": "slow", "ms": 1500, "by": "node"})),
        1
    );
    for a in raw["taskParam"].as_array().unwrap() {
        assert_eq!(a["result"]["content"][0]["text"], "render run #1", "{a}");
    }
    assert_eq!(
        paid.executions("render", &json!({"mode": "ok", "by": "node"})),
        1
    );
    let failed = &raw["failed"];
    assert_eq!(failed["first"]["result"]["status"], "failed", "{failed}");
    assert_eq!(failed["first"]["result"]["error"]["code"], -32000);
    assert_eq!(
        failed["first"]["result"]["error"]["message"],
        "quota exceeded"
    );
    assert_ne!(failed["secondId"], failed["firstId"]);
    assert_eq!(failed["firstAgain"]["result"], failed["first"]["result"]);
    assert!(!paid.saw_task_param());
    let items: Vec<Value> = raw["messages"].as_array().unwrap().clone();
    assert!(items.len() >= 5);
    validate(&py, &items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_takes_its_workflow_id_as_an_http_route_does() {
    let Setup {
        dir,
        paid: _paid,
        port: _port,
        gw,
    } = Setup::start().await;
    let url = gw.url("/mcp");
    let client = Client {
        url: &url,
        era: LEGACY,
        auth: ALICE,
        tasks: false,
    };
    let long = format!("  {}  ", "w".repeat(300));
    let cases = [
        ("x-workflow-id", long.as_str(), Some("w".repeat(200))),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("4bf92f3577b34da6a3ce929d0e0e4736".to_string()),
        ),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-bad-01",
            None,
        ),
    ];
    for (i, (header, value, _)) in cases.iter().enumerate() {
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "render", "arguments": {"mode": "ok", "case": i}}});
        let (status, _) = client.send(&message.to_string(), &[(header, value)]).await;
        assert_eq!(status, 200);
    }
    let out = crate::common::run(&[
        "ledger",
        "list",
        "--json",
        "--store",
        &format!("sqlite://{}", dir.path().join("ledger.db").display()),
    ]);
    let records: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(records.len(), cases.len());
    for (_, _, want) in &cases {
        // Trimmed and cut at 200 characters, and only a valid traceparent names one.
        let found = records
            .iter()
            .filter(|r| r["workflow_id"] == json!(want))
            .count();
        assert_eq!(found, 1, "{want:?} in {records:#?}");
    }
}
