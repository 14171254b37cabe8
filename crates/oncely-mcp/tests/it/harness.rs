//! Processes for the stories: the slow paid tool server (Python SDK), the oncely MCP
//! endpoint in-process, and the Python SDK client as a subprocess.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use oncely_mcp::{McpConfig, McpEndpoint, McpUpstream};
use oncely_store::Store;
use oncely_tower::Guard;
use serde_json::Value;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's python, or `None` (and a loud failure under CI) when setup.sh has not run.
pub(crate) fn python() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate_dir().join("../../target"));
    let candidates = [
        std::env::var_os("ONCELY_MCP_PYTHON").map(PathBuf::from),
        Some(target.join("mcp-venv/bin/python")),
        Some(crate_dir().join("../../target/mcp-venv/bin/python")),
    ];
    for c in candidates.into_iter().flatten() {
        if c.exists() {
            return Some(c);
        }
    }
    if std::env::var_os("CI").is_some() {
        panic!("the MCP interop tests need the Python SDK: run crates/oncely-mcp/tests/setup.sh");
    }
    eprintln!("SKIPPED: run crates/oncely-mcp/tests/setup.sh to run the MCP interop tests");
    None
}

/// The slow paid tool server; killed on drop.
pub(crate) struct PaidServer {
    child: Child,
    pub(crate) url: String,
    pub(crate) log: PathBuf,
    _dir: tempfile::TempDir,
}

impl PaidServer {
    pub(crate) fn start(python: &Path, delay: f64) -> PaidServer {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("executions.jsonl");
        let mut child = Command::new(python)
            .arg(crate_dir().join("tests/py/paid_server.py"))
            .arg("--log")
            .arg(&log)
            .arg("--delay")
            .arg(delay.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start paid_server.py");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let port = loop {
            let line = lines.next().expect("paid_server.py exited").unwrap();
            if let Some(p) = line.strip_prefix("PORT ") {
                break p.trim().parse::<u16>().unwrap();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        // uvicorn prints before it accepts; give it a moment to be ready.
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        for _ in 0..100 {
            if std::net::TcpStream::connect(addr).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        PaidServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            log,
            _dir: dir,
        }
    }

    /// Execution events of `tool`: (starts, dones, cancels).
    pub(crate) fn executions(&self, tool: &str) -> (usize, usize, usize) {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut counts = (0, 0, 0);
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            if v["tool"] != tool {
                continue;
            }
            match v["event"].as_str() {
                Some("start") => counts.0 += 1,
                Some("done") => counts.1 += 1,
                Some("cancelled") => counts.2 += 1,
                _ => {}
            }
        }
        counts
    }
}

impl Drop for PaidServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The oncely MCP endpoint on a port of its own; stopped on drop.
pub(crate) struct Gateway {
    pub(crate) url: String,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) guard: Arc<Guard>,
    task: tokio::task::JoinHandle<()>,
}

impl Gateway {
    pub(crate) async fn start(config: McpConfig) -> Gateway {
        Gateway::start_with_client(config, McpEndpoint::direct(None).unwrap()).await
    }

    pub(crate) async fn start_with_client(config: McpConfig, client: McpUpstream) -> Gateway {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let guard = Arc::new(Guard::new(store.clone(), b"test principal key".to_vec()));
        let path = config.path.clone();
        let endpoint = McpEndpoint::new(config, guard.clone(), client);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let svc = TowerToHyperService::new(endpoint.clone());
                tokio::spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Gateway {
            url: format!("http://{addr}{path}"),
            store,
            guard,
            task,
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs the Python SDK client with `plan` in `mode` ("legacy" or "2026-07-28").
pub(crate) async fn py_client(
    python: &Path,
    url: &str,
    mode: &str,
    auth: &str,
    plan: Value,
) -> Value {
    let out = tokio::process::Command::new(python)
        .arg(crate_dir().join("tests/py/client.py"))
        .arg(url)
        .arg(mode)
        .arg(plan.to_string())
        .env("MCP_AUTH", auth)
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("run client.py");
    assert!(out.status.success(), "client.py failed: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The text of a CallToolResult.
pub(crate) fn text(step: &Value) -> String {
    step["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result in {step}"))
        .to_string()
}

/// `_meta["dev.oncely/replay"].status` of a step, if any.
pub(crate) fn replay_status(step: &Value) -> Option<String> {
    step["result"]["_meta"]["dev.oncely/replay"]["status"]
        .as_str()
        .map(str::to_string)
}
