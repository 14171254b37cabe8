//! The 2026-07-28 custom headers from tool parameters, through the real binary: a tool
//! whose `inputSchema` marks parameters with `x-mcp-header` is called with each marked
//! argument also in a `Mcp-Param-{Name}` header, and oncely, an intermediary that reads
//! the body, checks every such header against the body (the Base64 sentinel decoded,
//! integers compared as numbers): a missing, extra, malformed or mismatched one gets
//! -32020 with HTTP 400 and never reaches the server ("Server Behavior for Custom
//! Headers"). The server is a real MCP server on 127.0.0.1 that counts its executions.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{json, Value};

use crate::common::{post as http_post, upstream, Gateway};

const MODERN: &str = "2026-07-28";

/// Headers as (name, value) pairs.
type Headers<'a> = Vec<(&'a str, &'a str)>;

/// One `tools/call` the server ran: its arguments and the `Mcp-Param-*` headers it got.
type Ran = (Value, Vec<(String, String)>);

/// Every `tools/call` the server ran.
#[derive(Default)]
struct Server {
    calls: Mutex<Vec<Ran>>,
}

async fn serve(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    let message: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let id = message["id"].clone();
    let result = match message["method"].as_str().unwrap_or("") {
        "tools/list" => json!({"resultType": "complete", "tools": [
            {"name": "query", "inputSchema": {"type": "object", "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "target": {"type": "object", "properties": {
                    "shard": {"type": "integer", "x-mcp-header": "Shard"}}},
                "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"},
                "sql": {"type": "string"}}}},
            {"name": "plain", "inputSchema": {"type": "object"}},
            {"name": "wetter-köln", "inputSchema": {"type": "object"}},
        ]}),
        "tools/call" => {
            let params: Vec<(String, String)> = headers
                .iter()
                .filter(|(n, _)| n.as_str().starts_with("mcp-param-"))
                .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect();
            let arguments = message["params"]["arguments"].clone();
            server.calls.lock().unwrap().push((arguments, params));
            json!({"resultType": "complete", "content": [{"type": "text", "text": "ran"}]})
        }
        _ => return StatusCode::ACCEPTED.into_response(),
    };
    let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
    ([("content-type", "application/json")], answer.to_string()).into_response()
}

struct Setup {
    _dir: tempfile::TempDir,
    server: Arc<Server>,
    url: String,
    _gw: Gateway,
}

impl Setup {
    async fn start() -> Setup {
        let server = Arc::new(Server::default());
        let router = axum::Router::new()
            .route("/mcp", post(serve))
            .with_state(server.clone());
        let port = upstream(router).await.port();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("oncely.toml");
        std::fs::write(
            &config,
            format!(
                "store = \"sqlite://{}\"\n\n[[mcp]]\npath = \"/mcp\"\n\
                 upstream = \"http://127.0.0.1:{port}/mcp\"\nwindow = \"1h\"\n",
                dir.path().join("ledger.db").display()
            ),
        )
        .unwrap();
        let gw = Gateway::start(&["--config", config.to_str().unwrap()], &[]);
        let url = gw.url("/mcp");
        Setup {
            _dir: dir,
            server,
            url,
            _gw: gw,
        }
    }

    fn executions(&self) -> usize {
        self.server.calls.lock().unwrap().len()
    }

    /// Sends `method` with `params` as a 2026-07-28 client, with its `Mcp-Method` and
    /// `Mcp-Name` and these headers besides: the HTTP status and the JSON-RPC answer.
    async fn send(
        &self,
        id: u64,
        method: &str,
        params: Value,
        name: &str,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut params = params;
        params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {}});
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut all = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", MODERN),
            ("authorization", "Bearer sk_alice"),
            ("mcp-method", method),
            ("mcp-name", name),
        ];
        all.extend_from_slice(headers);
        let answer = http_post(&self.url, &body.to_string(), &all).await;
        let value =
            serde_json::from_str(&answer.text()).unwrap_or_else(|_| json!({"text": answer.text()}));
        (answer.status.as_u16(), value)
    }

    async fn call(&self, id: u64, arguments: Value, headers: &[(&str, &str)]) -> (u16, Value) {
        let params = json!({"name": "query", "arguments": arguments});
        self.send(id, "tools/call", params, "query", headers).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_marked_argument_must_be_in_its_header() {
    let s = Setup::start().await;
    let (status, list) = s.send(1, "tools/list", json!({}), "", &[]).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["result"]["tools"].as_array().unwrap().len(), 3);

    let args =
        json!({"region": "us-west1", "target": {"shard": 42}, "dry": false, "sql": "SELECT 1"});
    let good = [
        ("mcp-param-region", "us-west1"),
        ("Mcp-Param-Shard", "42"),
        ("MCP-PARAM-DRY-RUN", "false"),
    ];
    let (status, answer) = s.call(2, args.clone(), &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], "ran", "{answer}");
    assert_eq!(s.executions(), 1);
    {
        let calls = s.server.calls.lock().unwrap();
        let mut forwarded = calls[0].1.clone();
        forwarded.sort();
        assert_eq!(
            forwarded,
            vec![
                ("mcp-param-dry-run".to_string(), "false".to_string()),
                ("mcp-param-region".to_string(), "us-west1".to_string()),
                ("mcp-param-shard".to_string(), "42".to_string()),
            ],
            "the headers reach the server untouched"
        );
    }

    // Each way a header can fail to carry its argument: 400, -32020, never forwarded.
    let other = json!({"region": "eu-north1", "target": {"shard": 7}, "dry": true});
    let cases: Vec<(&str, Value, Headers<'_>, &str)> = vec![
        (
            "a marked argument without its header",
            other.clone(),
            vec![("mcp-param-shard", "7"), ("mcp-param-dry-run", "true")],
            "Mcp-Param-Region",
        ),
        (
            "a header that disagrees with the body",
            other.clone(),
            vec![
                ("mcp-param-region", "us-west1"),
                ("mcp-param-shard", "7"),
                ("mcp-param-dry-run", "true"),
            ],
            "Mcp-Param-Region",
        ),
        (
            "a nested integer that disagrees",
            other.clone(),
            vec![
                ("mcp-param-region", "eu-north1"),
                ("mcp-param-shard", "8"),
                ("mcp-param-dry-run", "true"),
            ],
            "Mcp-Param-Shard",
        ),
        (
            "a boolean spelt otherwise",
            other.clone(),
            vec![
                ("mcp-param-region", "eu-north1"),
                ("mcp-param-shard", "7"),
                ("mcp-param-dry-run", "True"),
            ],
            "Mcp-Param-Dry-Run",
        ),
        (
            "a header for an argument the body does not carry",
            json!({"region": "eu-north1", "dry": true}),
            vec![
                ("mcp-param-region", "eu-north1"),
                ("mcp-param-shard", "7"),
                ("mcp-param-dry-run", "true"),
            ],
            "Mcp-Param-Shard",
        ),
        (
            "a value with bytes a header may not carry",
            json!({"region": "café"}),
            vec![("mcp-param-region", "café")],
            "Mcp-Param-Region",
        ),
        (
            "a sentinel that is not Base64",
            json!({"region": "eu"}),
            vec![("mcp-param-region", "=?base64?not base64?=")],
            "Mcp-Param-Region",
        ),
        (
            "a header given twice",
            json!({"region": "eu"}),
            vec![("mcp-param-region", "eu"), ("mcp-param-region", "eu")],
            "Mcp-Param-Region",
        ),
    ];
    for (i, (what, arguments, headers, named)) in cases.into_iter().enumerate() {
        let (status, answer) = s.call(10 + i as u64, arguments, &headers).await;
        assert_eq!(status, 400, "{what}: {answer}");
        assert_eq!(answer["error"]["code"], -32020, "{what}: {answer}");
        assert_eq!(answer["id"], 10 + i as u64, "{what}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(named), "{what}: {message}");
        assert_eq!(s.executions(), 1, "{what}: never forwarded");
    }

    // What passes: the sentinel decoded, an integer compared as a number, a null or
    // absent argument without a header, and the same call again is a replay.
    let passing: Vec<(&str, Value, Headers<'_>)> = vec![
        (
            "a Base64 sentinel",
            json!({"region": "Köln, Zone 1", "target": {"shard": -3}}),
            vec![
                ("mcp-param-region", "=?base64?S8O2bG4sIFpvbmUgMQ==?="),
                ("mcp-param-shard", "-3"),
            ],
        ),
        (
            "an integer written as 42.0",
            json!({"region": "ap", "target": {"shard": 42}}),
            vec![("mcp-param-region", "ap"), ("mcp-param-shard", "42.0")],
        ),
        (
            "null and absent arguments",
            json!({"region": null, "sql": "SELECT 2"}),
            vec![],
        ),
    ];
    for (i, (what, arguments, headers)) in passing.into_iter().enumerate() {
        let before = s.executions();
        let (status, answer) = s.call(30 + i as u64, arguments, &headers).await;
        assert_eq!(status, 200, "{what}: {answer}");
        assert!(answer.get("result").is_some(), "{what}: {answer}");
        assert_eq!(s.executions(), before + 1, "{what}");
    }
    let (status, again) = s.call(40, args, &good).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        s.executions(),
        4,
        "the first call again is answered from the ledger"
    );

    // A tool that marks nothing needs no header; an unknown Mcp-Param header passes.
    let plain = json!({"name": "plain", "arguments": {"x": 1}});
    let (status, answer) = s
        .send(
            50,
            "tools/call",
            plain,
            "plain",
            &[("mcp-param-anything", "1")],
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(s.executions(), 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_outside_the_header_safe_set_comes_in_the_base64_sentinel() {
    let s = Setup::start().await;
    let params = json!({"name": "wetter-köln", "arguments": {}});
    let encoded = "=?base64?d2V0dGVyLWvDtmxu?=";
    let (status, answer) = s.send(1, "tools/call", params.clone(), encoded, &[]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(s.executions(), 1);
    let (status, answer) = s
        .send(2, "tools/call", params, "=?base64?d2V0dGVy?=", &[])
        .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (400, &json!(-32020)),
        "{answer}"
    );
    assert_eq!(s.executions(), 1);
}
