//! The official TypeScript SDK (`@modelcontextprotocol/sdk`) as the client, against the
//! Python paid server and against `@modelcontextprotocol/server-everything` (streamable
//! HTTP), each through the gateway and, where the gateway makes the difference, directly.
//!
//! Needs `crates/oncely-mcp/tests/setup.sh` (`npm ci` in tests/node). Without Node.js or
//! the packages a test says so and passes, except under `CI`, where it fails loudly.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use oncely_mcp::McpConfig;
use serde_json::Value;

use crate::harness::{python, Gateway, PaidServer};

const AUTH: &str = "Bearer sk_test_alice";

pub(crate) fn node_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node")
}

/// True when `node` runs and the npm packages are installed.
pub(crate) fn node() -> bool {
    let ok = node_dir()
        .join("node_modules/@modelcontextprotocol/server-everything")
        .exists()
        && Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!("the TypeScript SDK tests need Node.js and crates/oncely-mcp/tests/setup.sh");
        }
        eprintln!("SKIPPED: install Node.js and run crates/oncely-mcp/tests/setup.sh");
    }
    ok
}

/// Runs the TypeScript SDK client with `scenario` against `url`.
async fn ts_client(url: &str, scenario: &str) -> Value {
    let out = tokio::process::Command::new("node")
        .arg(node_dir().join("client.mjs"))
        .arg(url)
        .arg(scenario)
        .env("MCP_AUTH", AUTH)
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run client.mjs");
    assert!(out.status.success(), "client.mjs failed: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client.mjs printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// server-everything in streamable HTTP mode on a free port; killed on drop.
struct Everything {
    child: Child,
    url: String,
}

impl Everything {
    fn start() -> Everything {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let entry =
            node_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
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
        Everything {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(outcome: &Value) -> String {
    outcome["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result in {outcome}"))
        .to_string()
}

fn replay_status(outcome: &Value) -> Option<&str> {
    outcome["result"]["_meta"]["dev.oncely/replay"]["status"].as_str()
}

/// The TypeScript SDK's request timeout sends `notifications/cancelled`: directly, the
/// paid work is abandoned and the retry pays again; through oncely the call runs once, to
/// its end, and the retry gets its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_timeout_cancels_nothing_and_the_retry_gets_the_result() {
    let Some(py) = python() else { return };
    if !node() {
        return;
    }
    let direct = PaidServer::start(&py, 4.0);
    let gated = PaidServer::start(&py, 4.0);
    let gw = Gateway::start(McpConfig::new("/mcp", &gated.url).unwrap()).await;
    let (direct_out, out) = tokio::join!(
        ts_client(&direct.url, "timeout"),
        ts_client(&gw.url, "timeout")
    );

    assert_eq!(direct_out["first"]["error"]["code"], -32001, "{direct_out}");
    let (starts, _, cancels) = direct.executions("render");
    assert_eq!(
        (starts, cancels),
        (2, 1),
        "direct: the SDK's cancellation abandons the paid work and the retry pays again"
    );

    assert_eq!(out["first"]["error"]["code"], -32001, "timed out: {out}");
    let retry = &out["retry"];
    assert!(text(retry).contains("render #1"), "{retry}");
    assert_eq!(replay_status(retry), Some("joined"), "{retry}");
    gw.guard.drain().await;
    assert_eq!(
        gated.executions("render"),
        (1, 1, 0),
        "executed once, never cancelled"
    );
}

/// server-everything through oncely: tools/list, resources, prompts and progress pass
/// through unchanged; a guarded tool that asks the client for sampling works through the
/// owner's stream, and its repeat is replayed without a second sampling round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_passes_through_and_a_sampling_tool_runs_once() {
    if !node() {
        return;
    }
    let server = Everything::start();
    let gw = Gateway::start(McpConfig::new("/mcp", &server.url).unwrap()).await;
    let (direct, out) = tokio::join!(
        ts_client(&server.url, "everything"),
        ts_client(&gw.url, "everything")
    );

    for key in ["tools", "resources", "read", "prompts", "prompt"] {
        assert_eq!(out[key], direct[key], "{key} passes through unchanged");
    }
    assert!(out["tools"].as_array().unwrap().len() > 5, "{out}");
    assert!(out["read"]["contents"][0]["text"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));
    assert!(out["prompt"]["messages"]
        .as_array()
        .is_some_and(|m| !m.is_empty()));

    assert_eq!(
        out["progress"].as_array().unwrap().len(),
        2,
        "progress notifications reach the client: {out}"
    );
    assert!(text(&out["long"]).contains("Long running operation completed"));
    assert_eq!(
        replay_status(&out["long"]),
        None,
        "a read-only tool is not guarded"
    );

    assert_eq!(direct["samplings"], 2, "direct: the tool runs twice");
    assert!(text(&out["sampled"]).contains("sampled answer #1"), "{out}");
    assert_eq!(replay_status(&out["sampled"]), None);
    assert_eq!(text(&out["sampledAgain"]), text(&out["sampled"]));
    // The result reached the client as an SSE event, before the stream's end (which waits
    // for the record): a repeat sent at once may find the call still being recorded and
    // join it. Either way it is answered from the one execution.
    assert!(
        matches!(
            replay_status(&out["sampledAgain"]),
            Some("replayed" | "joined")
        ),
        "{out}"
    );
    assert_eq!(
        out["samplings"], 1,
        "through oncely the sampling tool ran once"
    );

    gw.guard.drain().await;
    let records = gw.store.list(&Default::default()).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].route, "/mcp#trigger-sampling-request");
    assert_eq!(records[0].repeats, 1);
}
