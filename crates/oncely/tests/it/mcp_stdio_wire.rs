//! `oncely mcp` on the wire: raw JSON-RPC lines written to the real binary's standard
//! input, in front of a minimal stdio server without an SDK (`data/wire_server.py`, the
//! system Python), so that every protocol revision, batches, colliding ids, oversized
//! lines, signals and exit statuses are checked exactly. The SDK hosts and servers are
//! in `mcp_stdio`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::oncely;

const REVISIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];

fn server() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/data/wire_server.py")
}

/// One `oncely mcp` process in front of the wire server, driven line by line.
struct Wrapper {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Every stdout line so far.
    seen: Vec<String>,
    /// Messages read while waiting for another one.
    unclaimed: Vec<Value>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Wrapper {
    fn start(dir: &Path, extra: &[&str]) -> Wrapper {
        let store = format!("sqlite://{}", dir.join("mcp.db").display());
        Wrapper::on(&store, dir, extra)
    }

    /// One in front of a server logging to `dir`, on the ledger at `store`.
    fn on(store: &str, dir: &Path, extra: &[&str]) -> Wrapper {
        let log = dir.join("executions.jsonl");
        let mut cmd = oncely();
        cmd.arg("mcp")
            .arg("--store")
            .arg(store)
            .args(extra)
            .arg("--");
        cmd.arg("python3").arg(server()).arg(&log);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("oncely mcp starts");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Wrapper {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            unclaimed: Vec::new(),
            stderr,
        }
    }

    fn send(&mut self, message: &Value) {
        self.send_text(&message.to_string());
    }

    fn send_text(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// The message (or batch) that answers `id`: one read before and not claimed yet,
    /// else the next one to come (every line is kept in `seen`).
    fn answer(&mut self, id: &Value) -> Value {
        let answers = |value: &Value| match value {
            Value::Array(items) => items.iter().any(|m| m.get("id") == Some(id)),
            m => m.get("id") == Some(id) && m.get("method").is_none(),
        };
        if let Some(i) = self.unclaimed.iter().position(answers) {
            return self.unclaimed.remove(i);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "no answer to {id} within 20s; stdout: {:?}; stderr: {}",
                    self.seen,
                    self.stderr()
                )
            });
            self.seen.push(line.clone());
            let value: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
            if answers(&value) {
                return value;
            }
            self.unclaimed.push(value);
        }
    }

    /// The next message that is a request from the server (it has a `method` and `id`).
    fn server_request(&mut self) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .expect("a request from the server");
            self.seen.push(line.clone());
            let value: Value = serde_json::from_str(&line).unwrap();
            if value.get("method").is_some() && value.get("id").is_some() {
                return value;
            }
        }
    }

    fn initialize(&mut self, revision: &str) {
        if revision == "2026-07-28" {
            return;
        }
        self.send(
            &json!({"jsonrpc": "2.0", "id": "init", "method": "initialize",
            "params": {"protocolVersion": revision, "capabilities": {"roots": {}},
                "clientInfo": {"name": "wire-test", "version": "1"}}}),
        );
        let init = self.answer(&json!("init"));
        assert_eq!(init["result"]["protocolVersion"], revision, "{init}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Closes standard input and waits for the exit.
    fn close(&mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.wait()
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The rest of stdout, every line of which must be JSON too.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
                    self.seen.push(line);
                }
                for line in &self.seen {
                    assert!(
                        serde_json::from_str::<Value>(line).is_ok(),
                        "stdout line is not JSON: {line:?}"
                    );
                }
                return status;
            }
            assert!(Instant::now() < deadline, "oncely mcp did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Wrapper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A wrapper whose host called `render` (taking `seconds`) 300 ms ago, as id 1.
fn mid_call(dir: &Path, prompt: &str, seconds: f64) -> Wrapper {
    let mut w = Wrapper::start(dir, &[]);
    w.initialize("2025-06-18");
    let args = json!({"prompt": prompt, "seconds": seconds});
    w.send(&call(json!(1), "render", args, "2025-06-18"));
    std::thread::sleep(Duration::from_millis(300));
    w
}

/// A `tools/call` of `tool` with `arguments`, under `id`, of `revision`.
fn call(id: Value, tool: &str, arguments: Value, revision: &str) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    if revision == "2026-07-28" {
        params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": revision});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// The executions the server logged.
fn executions(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("executions.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What reached the server.
fn received(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("executions.jsonl.in"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The states of the records in the ledger at `dir`.
fn states(dir: &Path) -> Vec<String> {
    let list = crate::common::run(&[
        "ledger",
        "list",
        "--json",
        "--store",
        &format!("sqlite://{}", dir.join("mcp.db").display()),
    ]);
    let records: Value = serde_json::from_slice(&list.stdout).unwrap_or(Value::Null);
    records
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| r["state"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn replay_status(answer: &Value) -> Option<&str> {
    answer
        .pointer("/result/_meta/dev.oncely~1replay/status")
        .and_then(Value::as_str)
}

#[test]
fn every_revision_runs_a_repeated_call_once_and_answers_under_each_id() {
    for revision in REVISIONS {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wrapper::start(dir.path(), &[]);
        w.initialize(revision);
        w.send(&call(
            json!(1),
            "render",
            json!({"prompt": "a", "n": 1}),
            revision,
        ));
        let first = w.answer(&json!(1));
        assert_eq!(
            first["result"]["content"][0]["text"], "render #1",
            "{revision}: {first}"
        );
        assert_eq!(replay_status(&first), None, "{revision}: {first}");
        // The same call under another id and another spelling of its arguments.
        w.send_text(&format!(
            r#"{{"jsonrpc":"2.0","id":"again","method":"tools/call","params":{{"arguments":{{"n":1.0,"prompt":"a"}},"name":"render"{}}}}}"#,
            if revision == "2026-07-28" {
                r#","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#
            } else {
                ""
            }
        ));
        let second = w.answer(&json!("again"));
        assert_eq!(
            second["result"]["content"][0]["text"], "render #1",
            "{revision}: {second}"
        );
        assert_eq!(
            replay_status(&second),
            Some("replayed"),
            "{revision}: {second}"
        );
        // Other arguments run again.
        w.send(&call(json!(2), "render", json!({"prompt": "b"}), revision));
        assert_eq!(
            w.answer(&json!(2))["result"]["content"][0]["text"],
            "render #2"
        );
        let ran = executions(dir.path());
        assert_eq!(ran.len(), 2, "{revision}: {ran:?}");
        // The server saw the downstream key, and ids of the wrapper's own.
        assert!(
            ran[0]["key"]
                .as_str()
                .is_some_and(|k| k.starts_with("oncely-")),
            "{ran:?}"
        );
        assert!(ran.iter().all(|r| r["wire_id"].is_u64()), "{ran:?}");
        assert!(w.close().success(), "{revision}: {}", w.stderr());
    }
}

#[test]
fn a_read_only_tool_runs_every_time_even_before_the_host_lists_tools() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &[]);
    // At once after the handshake: the wrapper lists the tools itself after
    // `notifications/initialized`, and the calls wait for that.
    w.initialize("2025-06-18");
    for id in 1..=3 {
        w.send(&call(json!(id), "lookup", json!({"q": "x"}), "2025-06-18"));
        let answer = w.answer(&json!(id));
        assert_eq!(replay_status(&answer), None, "{answer}");
    }
    assert_eq!(executions(dir.path()).len(), 3);
    assert!(w.close().success());
}

#[test]
fn a_batch_of_2025_03_26_is_split_and_its_repeats_run_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &[]);
    w.initialize("2025-03-26");
    w.send(&json!([
        call(json!(1), "render", json!({"prompt": "batch", "seconds": 0.3}), "2025-03-26"),
        call(json!(2), "render", json!({"prompt": "batch", "seconds": 0.3}), "2025-03-26"),
        {"jsonrpc": "2.0", "id": 3, "method": "ping"},
    ]));
    let batch = w.answer(&json!(1));
    let items = batch.as_array().expect("a batch answer");
    let by_id = |id: i64| items.iter().find(|m| m["id"] == json!(id)).cloned();
    assert_eq!(items.len(), 3, "{batch}");
    let (a, b) = (by_id(1).unwrap(), by_id(2).unwrap());
    assert_eq!(a["result"]["content"], b["result"]["content"], "{batch}");
    assert!(by_id(3).unwrap()["result"].is_object(), "{batch}");
    assert_eq!(executions(dir.path()).len(), 1);
    assert!(w.close().success());
}

#[test]
fn a_host_that_reuses_the_id_of_a_call_it_cancelled_gets_its_own_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &[]);
    w.initialize("2025-06-18");
    w.send(&call(
        json!(5),
        "render",
        json!({"prompt": "slow", "seconds": 1.5}),
        "2025-06-18",
    ));
    std::thread::sleep(Duration::from_millis(300));
    w.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 5, "reason": "timeout"}}),
    );
    // Id 5 again, for something else, while the call still runs on the server.
    w.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}));
    let list = w.answer(&json!(5));
    assert!(
        list["result"]["tools"].is_array(),
        "the answer to the new request: {list}"
    );
    // The retry of the call joins it or replays it: one execution.
    w.send(&call(
        json!(6),
        "render",
        json!({"prompt": "slow", "seconds": 1.5}),
        "2025-06-18",
    ));
    let retry = w.answer(&json!(6));
    assert_eq!(
        retry["result"]["content"][0]["text"], "render #1",
        "{retry}"
    );
    assert!(
        matches!(replay_status(&retry), Some("joined" | "replayed")),
        "{retry}"
    );
    assert_eq!(executions(dir.path()).len(), 1);
    // The cancellation of the guarded call never reached the server, and nothing the
    // wrapper sent it reused an id.
    let got = received(dir.path());
    assert!(
        !got.iter().any(|m| m["method"] == "notifications/cancelled"),
        "{got:?}"
    );
    let ids: Vec<&Value> = got.iter().filter_map(|m| m.get("id")).collect();
    let unique: std::collections::HashSet<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_eq!(
        ids.len(),
        unique.len(),
        "an id reached the server twice: {ids:?}"
    );
    // The stale answer under 5 was never written after the new one.
    let fives = w
        .seen
        .iter()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["id"] == json!(5))
        .count();
    assert_eq!(fives, 1, "{:?}", w.seen);
    assert!(w.close().success());
}

#[test]
fn a_server_request_reaches_the_host_and_its_answer_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &[]);
    w.initialize("2025-06-18");
    w.send(&call(
        json!(1),
        "render",
        json!({"prompt": "r", "roots": true}),
        "2025-06-18",
    ));
    let ask = w.server_request();
    assert_eq!(ask["method"], "roots/list", "{ask}");
    assert_eq!(
        ask["id"], "roots-1",
        "the server's own id passes as it is: {ask}"
    );
    w.send(
        &json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": [{"uri": "file:///tmp"}]}}),
    );
    let done = w.answer(&json!(1));
    assert_eq!(done["result"]["content"][0]["text"], "render #1", "{done}");
    let got = received(dir.path());
    assert!(
        got.iter()
            .any(|m| m.pointer("/response/result/roots/0/uri") == Some(&json!("file:///tmp"))),
        "{got:?}"
    );
    assert!(w.close().success());
}

#[test]
fn a_message_over_max_body_is_refused_under_its_own_id_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("oncely.toml");
    std::fs::write(&config, "max_body = \"1KiB\"\n").unwrap();
    let mut w = Wrapper::start(dir.path(), &["--config", config.to_str().unwrap()]);
    w.initialize("2025-06-18");
    let big = "x".repeat(5000);
    w.send(&call(
        json!(9),
        "render",
        json!({"prompt": big}),
        "2025-06-18",
    ));
    let refused = w.answer(&json!(9));
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_body"),
        "{refused}"
    );
    // Not JSON at all: a parse error; the session goes on.
    w.send_text("{not json");
    let parse = w.answer(&Value::Null);
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    w.send(&call(
        json!(10),
        "render",
        json!({"prompt": "small"}),
        "2025-06-18",
    ));
    assert_eq!(
        w.answer(&json!(10))["result"]["content"][0]["text"],
        "render #1"
    );
    assert_eq!(executions(dir.path()).len(), 1, "the big call never ran");
    assert!(w.close().success());
}

#[test]
fn stdin_closed_mid_call_finishes_and_records_it_before_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = mid_call(dir.path(), "left", 1.5);
    let status = w.close();
    assert!(status.success(), "{status:?}: {}", w.stderr());
    assert_eq!(executions(dir.path()).len(), 1);
    // A new wrapper replays it.
    let mut again = Wrapper::start(dir.path(), &[]);
    again.initialize("2025-06-18");
    again.send(&call(
        json!(1),
        "render",
        json!({"prompt": "left", "seconds": 1.5}),
        "2025-06-18",
    ));
    let replay = again.answer(&json!(1));
    assert_eq!(replay_status(&replay), Some("replayed"), "{replay}");
    assert_eq!(executions(dir.path()).len(), 1);
    assert!(again.close().success());
}

#[cfg(unix)]
#[test]
fn sigterm_mid_call_finishes_and_records_it_then_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = mid_call(dir.path(), "t", 1.5);
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &w.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = w.wait();
    assert!(status.success(), "{status:?}: {}", w.stderr());
    let ran = executions(dir.path());
    assert_eq!(ran.len(), 1, "the call ran to its end: {ran:?}");
    assert_eq!(states(dir.path()), ["completed"]);
}

#[cfg(unix)]
#[test]
fn the_wrapper_killed_mid_call_still_finishes_and_records_it() {
    // A host that gives up on the wrapper kills it (the Python SDK kills its process
    // group): the worker, out of that group, runs the call to its end.
    let dir = tempfile::tempdir().unwrap();
    let mut w = mid_call(dir.path(), "k", 2.0);
    w.child.kill().unwrap();
    let _ = w.child.wait();
    // Killed before the call ended: not recorded yet.
    assert_eq!(states(dir.path()), ["processing"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let states = states(dir.path());
        if states == ["completed"] {
            break;
        }
        assert!(Instant::now() < deadline, "never recorded: {states:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(executions(dir.path()).len(), 1);
}

#[test]
fn a_server_that_exits_by_itself_ends_the_wrapper_with_its_status() {
    let dir = tempfile::tempdir().unwrap();
    // The host keeps its end open: only the server's exit can end the wrapper.
    let mut child = oncely()
        .args(["mcp", "--store"])
        .arg(format!("sqlite://{}", dir.path().join("mcp.db").display()))
        .args(["--", "sh", "-c", "sleep 0.5; exit 3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn two_wrappers_on_one_store_run_concurrent_identical_calls_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Wrapper::start(dir.path(), &[]);
    let mut b = Wrapper::start(dir.path(), &[]);
    a.initialize("2025-06-18");
    b.initialize("2025-06-18");
    for id in 0..4 {
        let c = call(
            json!(id),
            "render",
            json!({"prompt": "together", "seconds": 1}),
            "2025-06-18",
        );
        a.send(&c);
        b.send(&c);
    }
    let mut texts = Vec::new();
    for id in 0..4 {
        texts.push(a.answer(&json!(id))["result"]["content"][0]["text"].clone());
        texts.push(b.answer(&json!(id))["result"]["content"][0]["text"].clone());
    }
    assert!(texts.iter().all(|t| t == "render #1"), "{texts:?}");
    assert_eq!(executions(dir.path()).len(), 1);
    assert!(a.close().success());
    assert!(b.close().success());
}

#[test]
fn the_default_store_is_in_oncely_home_created_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    // A host's session that ends at once, with these variables.
    let session = |set: (&str, &Path), unset: &str| {
        let out = oncely()
            .env(set.0, set.1)
            .env_remove(unset)
            .args(["mcp", "--", "python3"])
            .arg(server())
            .arg(dir.path().join("log"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
    };
    let home = dir.path().join("a/b/oncely");
    session(("ONCELY_HOME", &home), "XDG_DATA_HOME");
    assert!(home.join("mcp.db").exists());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for d in [dir.path().join("a"), dir.path().join("a/b"), home.clone()] {
            let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
    }
    // XDG_DATA_HOME without ONCELY_HOME.
    let xdg = dir.path().join("xdg");
    session(("XDG_DATA_HOME", &xdg), "ONCELY_HOME");
    assert!(xdg.join("oncely/mcp.db").exists());
}

#[test]
fn a_slow_call_of_a_tasks_client_becomes_a_task_answered_from_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &["--wait", "1s"]);
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}}});
    let slow = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "render", "arguments": {"prompt": "task", "seconds": 2.5}, "_meta": meta}});
    w.send(&slow);
    let created = w.answer(&json!(1));
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task_id = created["result"]["taskId"]
        .as_str()
        .expect("a task id")
        .to_owned();
    let mut done = Value::Null;
    for i in 0..100 {
        w.send(
            &json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tasks/get",
            "params": {"taskId": task_id, "_meta": meta}}),
        );
        let got = w.answer(&json!(100 + i));
        if got["result"]["status"] != "working" {
            done = got;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"], "render #1",
        "{done}"
    );
    // The same call again: the stored result, no second execution.
    let mut again = slow.clone();
    again["id"] = json!(2);
    w.send(&again);
    let replay = w.answer(&json!(2));
    assert_eq!(
        replay["result"]["content"][0]["text"], "render #1",
        "{replay}"
    );
    assert_eq!(executions(dir.path()).len(), 1);
    // The server never saw a tasks/* request: oncely answered them.
    assert!(!received(dir.path()).iter().any(|m| m["method"]
        .as_str()
        .is_some_and(|x| x.starts_with("tasks/"))));
    assert!(w.close().success());
}

#[test]
fn a_call_the_ledger_cannot_record_is_refused_and_never_reaches_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &[]);
    w.initialize("2025-06-18");
    // Another process holds the ledger's write lock longer than oncely waits for it.
    let db = dir.path().join("mcp.db");
    let mut locker = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys,time\n\
             c=sqlite3.connect(sys.argv[1],isolation_level=None)\n\
             c.execute('BEGIN EXCLUSIVE')\n\
             print('locked',flush=True)\n\
             time.sleep(float(sys.argv[2]))\n\
             c.execute('ROLLBACK')",
        )
        .arg(&db)
        .arg("8")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(locker.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "locked");
    w.send(&call(
        json!(1),
        "render",
        json!({"prompt": "locked out"}),
        "2025-06-18",
    ));
    let refused = w.answer(&json!(1));
    assert_eq!(
        refused["error"]["data"]["oncely"], "store_unavailable",
        "{refused}"
    );
    assert_eq!(
        executions(dir.path()).len(),
        0,
        "forwarded without a record"
    );
    locker.wait().unwrap();
    w.send(&call(
        json!(2),
        "render",
        json!({"prompt": "locked out"}),
        "2025-06-18",
    ));
    let ran = w.answer(&json!(2));
    assert_eq!(ran["result"]["content"][0]["text"], "render #1", "{ran}");
    assert_eq!(executions(dir.path()).len(), 1);
    assert!(w.close().success());
}

#[test]
fn a_stateless_host_s_read_only_calls_at_once_all_run() {
    // 2026-07-28 has no handshake: the first request names the revision, and the wrapper
    // learns the tools in it before the calls go on.
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &[]);
    for id in 1..=3 {
        w.send(&call(
            json!(id),
            "lookup",
            json!({"q": "now"}),
            "2026-07-28",
        ));
    }
    for id in 1..=3 {
        let answer = w.answer(&json!(id));
        assert_eq!(replay_status(&answer), None, "{answer}");
    }
    assert_eq!(executions(dir.path()).len(), 3);
    // A paid call is still guarded.
    w.send(&call(
        json!(4),
        "render",
        json!({"prompt": "p"}),
        "2026-07-28",
    ));
    w.answer(&json!(4));
    w.send(&call(
        json!(5),
        "render",
        json!({"prompt": "p"}),
        "2026-07-28",
    ));
    assert_eq!(replay_status(&w.answer(&json!(5))), Some("replayed"));
    assert!(w.close().success());
}

/// The resident memory of the `oncely mcp` worker under the front `front`, in KiB.
#[cfg(target_os = "linux")]
fn worker_rss_kib(front: u32) -> u64 {
    let children =
        std::fs::read_to_string(format!("/proc/{front}/task/{front}/children")).unwrap_or_default();
    let mut rss = 0;
    for pid in children.split_whitespace() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "oncely" {
            continue;
        }
        for line in status.lines() {
            if let Some(kib) = line.strip_prefix("VmRSS:") {
                rss = rss.max(
                    kib.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse()
                        .unwrap_or(0),
                );
            }
        }
    }
    rss
}

#[cfg(target_os = "linux")]
#[test]
fn a_host_that_stops_reading_neither_grows_the_wrapper_nor_loses_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &[]);
    w.initialize("2025-06-18");
    // 300 MB of the server's notifications (logging), then the result, to a host that
    // reads nothing more.
    w.send(&call(
        json!(1),
        "render",
        json!({"prompt": "loud", "spam": 300_000}),
        "2025-06-18",
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut peak = 0;
    loop {
        peak = peak.max(worker_rss_kib(w.child.id()));
        if executions(dir.path()).len() == 1 && states(dir.path()) == ["completed"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the call was not recorded: {:?}",
            states(dir.path())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    peak = peak.max(worker_rss_kib(w.child.id()));
    assert!(peak > 0, "the worker's memory was read");
    assert!(peak < 200 * 1024, "the wrapper grew to {peak} KiB");
    assert!(
        w.stderr().contains("does not read its input"),
        "{}",
        w.stderr()
    );
}

#[test]
fn a_call_with_a_number_past_a_double_is_guarded_and_answered() {
    // `1e400` is JSON, but not a number serde_json holds: the call is still guarded,
    // renumbered and answered, its arguments reaching the server as written.
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &[]);
    w.initialize("2025-06-18");
    for id in [1, 2] {
        w.send_text(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"render","arguments":{{"n":1e400}}}}}}"#
        ));
    }
    // Sent together, either may be the original: one ran, the other got its result.
    let answers = [w.answer(&json!(1)), w.answer(&json!(2))];
    for a in &answers {
        assert_eq!(a["result"]["content"][0]["text"], "render #1", "{a}");
    }
    let repeats = answers
        .iter()
        .filter(|a| replay_status(a).is_some())
        .count();
    assert_eq!(repeats, 1, "{answers:?}");
    let got = std::fs::read_to_string(dir.path().join("executions.jsonl.in")).unwrap();
    assert!(got.contains("1e400") || got.contains("Infinity"), "{got}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("executions.jsonl"))
            .unwrap()
            .lines()
            .count(),
        1
    );
    assert!(w.close().success());
}

#[test]
fn a_result_with_a_number_past_a_double_is_answered_and_stored() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &[]);
    w.initialize("2025-06-18");
    let args = json!({"prompt": "h", "huge": true});
    w.send(&call(json!(1), "render", args.clone(), "2025-06-18"));
    let first = w.answer(&json!(1));
    assert_eq!(
        first["result"]["content"][0]["text"], "render #1",
        "{first}"
    );
    assert!(
        first["result"]["structuredContent"]["n"].is_string(),
        "{first}"
    );
    w.send(&call(json!(2), "render", args, "2025-06-18"));
    let second = w.answer(&json!(2));
    assert_eq!(replay_status(&second), Some("replayed"), "{second}");
    assert_eq!(states(dir.path()), ["completed"]);
    assert!(w.close().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrappers_on_one_postgresql_database_run_concurrent_identical_calls_once() {
    // Machines that share one PostgreSQL ledger are one guard, as `oncely serve`s are.
    let store = crate::cluster::fresh_schema(&crate::cluster::shared_url()).await;
    let dir = tempfile::tempdir().unwrap();
    tokio::task::spawn_blocking(move || {
        let mut wrappers: Vec<Wrapper> = (0..3)
            .map(|_| Wrapper::on(&store, dir.path(), &[]))
            .collect();
        for w in &mut wrappers {
            w.initialize("2025-06-18");
        }
        let args = json!({"prompt": "pg", "seconds": 1});
        for id in 0..3 {
            for w in &mut wrappers {
                w.send(&call(json!(id), "render", args.clone(), "2025-06-18"));
            }
        }
        for id in 0..3 {
            for w in &mut wrappers {
                let a = w.answer(&json!(id));
                assert_eq!(a["result"]["content"][0]["text"], "render #1", "{a}");
            }
        }
        assert_eq!(executions(dir.path()).len(), 1);
        for w in &mut wrappers {
            assert!(w.close().success());
        }
    })
    .await
    .unwrap();
}

#[test]
fn tool_patterns_choose_the_guarded_tools() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wrapper::start(dir.path(), &["--tool", "rend*", "--action", "publish"]);
    w.initialize("2025-06-18");
    for id in [1, 2] {
        w.send(&call(json!(id), "render", json!({"p": 1}), "2025-06-18"));
        w.answer(&json!(id));
    }
    // `publish` is an action, but not among the guarded tools: it runs every time.
    for id in [3, 4] {
        w.send(&call(json!(id), "publish", json!({"p": 1}), "2025-06-18"));
        assert_eq!(replay_status(&w.answer(&json!(id))), None);
    }
    let ran: Vec<String> = executions(dir.path())
        .iter()
        .map(|e| e["tool"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ran, ["render", "publish", "publish"]);
    assert!(w.close().success());
}
