//! `oncely mcp -- COMMAND` through the real binary: a stdio MCP host of an official SDK
//! (the Python SDK's `stdio_client` + `ClientSession`, the TypeScript SDK's
//! `StdioClientTransport` + `Client`) starts `oncely mcp --store sqlite://TMP -- SERVER`,
//! where SERVER is a stdio MCP server of the same SDKs (oncely-mcp's
//! `tests/{py,node}/stdio_{host,server}.*`). The server logs every tool execution to a
//! file, so that each test counts what really ran.
//!
//! Some tests drive `oncely mcp` themselves over its standard input and output (no SDK on
//! the host's side), to see every byte it writes and its exit status.
//!
//! Needs `crates/oncely-mcp/tests/setup.sh` (the venv with `mcp`, and Node.js with the
//! TypeScript SDK); without them a test says so and passes, except under `CI`, where it
//! fails.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{oncely, run, stderr, stdout};

const REPLAY: &str = "dev.oncely/replay";
const KEY: &str = "dev.oncely/idempotency-key";
/// The longest a host scenario may take.
const HOST_TIMEOUT: Duration = Duration::from_secs(40);

use crate::mcp_tasks::{mcp_tests, node};

/// One official SDK: its interpreter and its stdio host and server scripts.
#[derive(Clone, Debug)]
struct Sdk {
    name: &'static str,
    program: PathBuf,
    host: PathBuf,
    server: PathBuf,
}

impl Sdk {
    fn python() -> Option<Sdk> {
        let program = crate::mcp::python()?;
        Some(Sdk {
            name: "python",
            program,
            host: mcp_tests().join("py/stdio_host.py"),
            server: mcp_tests().join("py/stdio_server.py"),
        })
    }

    fn node() -> Option<Sdk> {
        node().then(|| Sdk {
            name: "node",
            program: PathBuf::from("node"),
            host: mcp_tests().join("node/stdio_host.mjs"),
            server: mcp_tests().join("node/stdio_server.mjs"),
        })
    }
}

/// The SDKs installed (each missing one says SKIPPED).
fn sdks() -> Vec<Sdk> {
    [Sdk::python(), Sdk::node()].into_iter().flatten().collect()
}

/// A test's temporary directory: the ledger and the server's execution log.
struct Case {
    dir: tempfile::TempDir,
    store: String,
    log: PathBuf,
}

impl Case {
    fn new() -> Case {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("sqlite://{}", dir.path().join("mcp.db").display());
        let log = dir.path().join("executions.jsonl");
        Case { dir, store, log }
    }

    /// `oncely mcp --store STORE [OPTIONS] -- SERVER --log LOG [SERVER_ARGS]`, as a
    /// command line (the binary's path first).
    fn wrapper(&self, options: &[&str], server: &Sdk, server_args: &[&str]) -> Vec<OsString> {
        let mut line: Vec<OsString> = vec![
            oncely().get_program().to_owned(),
            "mcp".into(),
            "--store".into(),
            self.store.clone().into(),
        ];
        line.extend(options.iter().map(OsString::from));
        line.push("--".into());
        line.push(server.program.clone().into());
        line.push(server.server.clone().into());
        line.push("--log".into());
        line.push(self.log.clone().into());
        line.extend(server_args.iter().map(OsString::from));
        line
    }

    /// Every line the server logged.
    fn logged(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// How many `event` lines the server logged for `tool` ("start": executions).
    fn events(&self, tool: &str, event: &str) -> usize {
        self.logged()
            .iter()
            .filter(|e| e["tool"] == tool && e["event"] == event)
            .count()
    }

    fn starts(&self, tool: &str) -> usize {
        self.events(tool, "start")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `oncely ledger list --store STORE --json`.
    fn ledger(&self) -> Vec<Value> {
        let list = run(&["ledger", "list", "--json", "--store", &self.store]);
        assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
        let list: Value = serde_json::from_str(&stdout(&list))
            .unwrap_or_else(|e| panic!("ledger list --json: {e}: {}", stdout(&list)));
        list.as_array().unwrap().clone()
    }

    /// `oncely usage --store STORE --json`.
    fn usage(&self) -> Value {
        let usage = run(&["usage", "--json", "--store", &self.store]);
        assert_eq!(usage.status.code(), Some(0), "{}", stderr(&usage));
        serde_json::from_str(&stdout(&usage)).unwrap()
    }
}

/// What a host printed, and its standard error (oncely's and the server's logs pass
/// through it) for the assertions' messages.
struct HostRun {
    out: Value,
    stderr: String,
}

impl HostRun {
    fn step(&self, i: usize) -> &Value {
        &self.out["steps"][i]
    }
}

impl std::fmt::Display for HostRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\n--- host stderr:\n{}", self.out, self.stderr)
    }
}

/// Runs `sdk`'s host with `scenario` in front of the server command line `wrapped`.
async fn host(sdk: &Sdk, scenario: &[&str], wrapped: &[OsString]) -> HostRun {
    let child = tokio::process::Command::new(&sdk.program)
        .arg(&sdk.host)
        .args(scenario)
        .arg("--")
        .args(wrapped)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the host");
    let out = tokio::time::timeout(HOST_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the {} host did not finish {scenario:?}", sdk.name))
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the {} host failed {scenario:?} ({}): {}\n--- stderr:\n{err}",
        sdk.name,
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let out = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("the {} host printed no JSON ({e}): {text}\n{err}", sdk.name));
    HostRun { out, stderr: err }
}

/// The replay `_meta` status of a call's outcome, if any.
fn replay(outcome: &Value) -> Option<&str> {
    outcome["meta"][REPLAY]["status"].as_str()
}

#[track_caller]
fn assert_fresh(outcome: &Value, text: &str, run: &HostRun) {
    assert_eq!(outcome["text"], text, "{run}");
    assert_eq!(outcome["isError"], false, "{run}");
    assert_eq!(replay(outcome), None, "a first call is no replay: {run}");
}

#[track_caller]
fn assert_replay(outcome: &Value, text: &str, statuses: &[&str], run: &HostRun) {
    assert_eq!(
        outcome["text"], text,
        "the repeat gets the original's result: {run}"
    );
    assert_eq!(outcome["isError"], false, "{run}");
    let status = replay(outcome);
    assert!(
        status.is_some_and(|s| statuses.contains(&s)),
        "_meta[{REPLAY:?}].status should be one of {statuses:?}, is {status:?}: {run}"
    );
    assert!(
        outcome["meta"][REPLAY]["original_at"].is_string(),
        "the replay says when the original ran: {run}"
    );
}

/// The one ledger record, completed, of a guarded `render` call.
#[track_caller]
fn assert_one_completed_render(case: &Case, repeats: u64) {
    let records = case.ledger();
    assert_eq!(records.len(), 1, "one record: {records:?}");
    let record = &records[0];
    assert!(
        record["route"]
            .as_str()
            .is_some_and(|r| r.contains("render")),
        "{record}"
    );
    assert_eq!(record["state"], "completed", "{record}");
    assert_eq!(record["repeats"], repeats, "{record}");
}

/// A paid tool called twice, one call after the other, by every pairing of the SDKs'
/// hosts and servers: it runs once, the repeat is answered from the ledger with the
/// replay `_meta`, the server saw oncely's idempotency key, and the ledger and usage
/// say one fresh call and one repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_tool_called_twice_runs_once_and_the_repeat_is_replayed() {
    let sdks = sdks();
    for host_sdk in &sdks {
        for server_sdk in &sdks {
            let case = Case::new();
            let run = host(host_sdk, &["twice"], &case.wrapper(&[], server_sdk, &[])).await;
            let pair = format!("{} host, {} server", host_sdk.name, server_sdk.name);
            assert_fresh(run.step(0), "rendered a #1", &run);
            assert_replay(run.step(1), "rendered a #1", &["replayed"], &run);
            assert_eq!(
                case.starts("render"),
                1,
                "{pair}: the paid tool ran once: {run}"
            );
            let logged = case.logged();
            assert!(
                logged[0]["key"].as_str().is_some_and(|k| !k.is_empty()),
                "{pair}: the guarded call reaches the server with _meta[{KEY:?}]: {logged:?}"
            );
            assert_one_completed_render(&case, 1);
            assert_eq!(
                case.usage()["totals"],
                json!({"fresh": 1, "fresh_units": 1, "repeats": 1, "repeat_units": 1}),
                "{pair}"
            );
        }
    }
}

/// The same tool with other arguments is another call: it runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_other_arguments_runs_again() {
    for sdk in sdks() {
        let case = Case::new();
        let run = host(&sdk, &["different"], &case.wrapper(&[], &sdk, &[])).await;
        assert_fresh(run.step(0), "rendered a #1", &run);
        assert_fresh(run.step(1), "rendered b #2", &run);
        assert_eq!(case.starts("render"), 2, "{}: {run}", sdk.name);
        assert_eq!(case.ledger().len(), 2, "{}", sdk.name);
    }
}

/// A tool annotated `readOnlyHint: true` is not guarded: it runs every time, without a
/// key, and the ledger keeps nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_tool_runs_every_time() {
    for sdk in sdks() {
        let case = Case::new();
        let run = host(&sdk, &["readonly"], &case.wrapper(&[], &sdk, &[])).await;
        assert_fresh(run.step(0), "looked up x #1", &run);
        assert_fresh(run.step(1), "looked up x #2", &run);
        assert_eq!(case.starts("lookup"), 2, "{}: {run}", sdk.name);
        assert!(
            case.logged().iter().all(|e| e["key"].is_null()),
            "{}: a read-only call is passed on as it is: {}",
            sdk.name,
            case.log_text()
        );
        assert_eq!(case.ledger(), Vec::<Value>::new(), "{}", sdk.name);
    }
}

/// A tool the operator names with `--tool` is guarded even though the server annotates it
/// `readOnlyHint: true` (annotations are untrusted hints): it runs once, the repeat is a
/// replay, and the log says which named tool the server calls read-only. A pattern that
/// matches it does not guard it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_tool_named_with_tool_is_guarded_and_the_log_says_so() {
    for sdk in sdks() {
        let case = Case::new();
        let options = ["--tool", "lookup", "--tool", "render"];
        let run = host(&sdk, &["readonly"], &case.wrapper(&options, &sdk, &[])).await;
        assert_fresh(run.step(0), "looked up x #1", &run);
        assert_replay(run.step(1), "looked up x #1", &["replayed"], &run);
        assert_eq!(case.starts("lookup"), 1, "{}: {run}", sdk.name);
        assert_eq!(case.ledger().len(), 1, "{}", sdk.name);
        assert!(
            run.stderr.contains("readOnlyHint") && run.stderr.contains("lookup"),
            "{}: the log names the overruled hint: {run}",
            sdk.name
        );

        let case = Case::new();
        let run = host(
            &sdk,
            &["readonly"],
            &case.wrapper(&["--tool", "look*"], &sdk, &[]),
        )
        .await;
        assert_eq!(case.starts("lookup"), 2, "{}: a pattern: {run}", sdk.name);
        assert_eq!(case.ledger(), Vec::<Value>::new(), "{}", sdk.name);
    }
}

/// Read-only calls the host makes at once, first thing after `initialize` (before it ever
/// lists the tools): each one runs, none is answered with another's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_calls_at_once_right_after_initialize_all_run() {
    for sdk in sdks() {
        let case = Case::new();
        let lookup = json!({"call": "lookup", "args": {"q": "y"}});
        let plan = json!([{"parallel": [lookup, lookup, lookup]}]).to_string();
        let run = host(&sdk, &[plan.as_str()], &case.wrapper(&[], &sdk, &[])).await;
        let outcomes = run.step(0)["parallel"].as_array().unwrap();
        for outcome in outcomes {
            assert_eq!(outcome["isError"], false, "{run}");
            assert_eq!(
                replay(outcome),
                None,
                "{}: a read-only call is never a replay: {run}",
                sdk.name
            );
        }
        assert_eq!(
            case.starts("lookup"),
            3,
            "{}: {}",
            sdk.name,
            case.log_text()
        );
        assert_eq!(case.ledger(), Vec::<Value>::new(), "{}", sdk.name);
    }
}

/// A host that gives up on a slow paid call (its SDK sends `notifications/cancelled`)
/// and then asks again: the call ran on (the cancellation never reached the server), ran
/// once, and the second ask gets its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_gives_up_and_asks_again_pays_once() {
    for sdk in sdks() {
        let case = Case::new();
        let run = host(&sdk, &["giveup"], &case.wrapper(&[], &sdk, &[])).await;
        assert_eq!(run.step(0)["error"]["kind"], "timeout", "{run}");
        assert_replay(
            run.step(1),
            "rendered slow #1",
            &["joined", "replayed"],
            &run,
        );
        assert_eq!(case.starts("render"), 1, "{}: ran once: {run}", sdk.name);
        assert_eq!(
            case.events("render", "cancelled"),
            0,
            "{}: never interrupted: {}",
            sdk.name,
            case.log_text()
        );
        assert_eq!(case.events("render", "done"), 1, "{}", case.log_text());
        assert_one_completed_render(&case, 1);
    }
}

/// Two hosts at once, each with its own `oncely mcp` on one store, each making the same
/// slow paid call twice at once: one execution, and every other call gets its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_wrappers_on_one_store_are_one_guard() {
    for sdk in sdks() {
        let case = Case::new();
        let call = json!({"call": "render", "args": {"prompt": "together", "seconds": 2}});
        let plan = json!([{"parallel": [call, call]}]).to_string();
        let wrapped = case.wrapper(&[], &sdk, &[]);
        let scenario = [plan.as_str()];
        let (a, b) = tokio::join!(
            host(&sdk, &scenario, &wrapped),
            host(&sdk, &scenario, &wrapped)
        );
        let outcomes: Vec<(&HostRun, &Value)> = [&a, &b]
            .into_iter()
            .flat_map(|r| {
                r.step(0)["parallel"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(move |o| (r, o))
            })
            .collect();
        assert_eq!(outcomes.len(), 4);
        for (run, outcome) in &outcomes {
            assert_eq!(outcome["text"], "rendered together #1", "{run}");
        }
        let fresh = outcomes.iter().filter(|(_, o)| replay(o).is_none()).count();
        assert_eq!(fresh, 1, "one original, three repeats:\n{a}\n{b}");
        for (run, outcome) in outcomes.iter().filter(|(_, o)| replay(o).is_some()) {
            assert_replay(
                outcome,
                "rendered together #1",
                &["joined", "replayed"],
                run,
            );
        }
        assert_eq!(
            case.starts("render"),
            1,
            "{}: one execution for two wrappers: {}",
            sdk.name,
            case.log_text()
        );
        assert_one_completed_render(&case, 3);
    }
}

/// A host that leaves while a paid call runs (the Python SDK cancels the call, then
/// closes the wrapper's input; the TypeScript SDK closes it; both kill the wrapper if it
/// outlives their grace period): the call runs to its end and is recorded, and a new host
/// with a new wrapper gets it replayed without a second execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_leaves_mid_call_has_it_recorded_and_replayed() {
    for sdk in sdks() {
        let case = Case::new();
        let wrapped = case.wrapper(&[], &sdk, &[]);
        let left = host(&sdk, &["close-mid-call", "1.5"], &wrapped).await;
        assert_eq!(left.step(0)["abandoned"], "render", "{left}");
        // The host waited for the wrapper's exit, or killed it: by now the call ended.
        let deadline = Instant::now() + Duration::from_secs(5);
        while case.events("render", "done") == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(case.starts("render"), 1, "{}: {left}", sdk.name);
        assert_eq!(
            case.events("render", "done"),
            1,
            "{}: the call ran to its end: {}\n{left}",
            sdk.name,
            case.log_text()
        );
        assert_eq!(case.events("render", "cancelled"), 0, "{}", case.log_text());
        if sdk.name == "node" {
            // The TypeScript SDK says how the wrapper ended: with 0, not killed (it
            // sends SIGTERM 2 s after closing the input, SIGKILL 2 s later).
            assert_eq!(
                left.out["exit"],
                json!({"code": 0, "signal": null}),
                "{left}"
            );
        }
        assert_one_completed_render(&case, 0);

        let again = host(&sdk, &["render", "left 1.5"], &wrapped).await;
        assert_replay(again.step(0), "rendered left #1", &["replayed"], &again);
        assert_eq!(case.starts("render"), 1, "{}: {again}", sdk.name);
    }
}

/// A server's sampling request reaches the host through oncely and its answer goes back;
/// the guarded tool that sampled is replayed the second time (no second sampling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_from_the_server_reaches_the_host_and_back() {
    for sdk in sdks() {
        let case = Case::new();
        let run = host(&sdk, &["sampling"], &case.wrapper(&[], &sdk, &[])).await;
        assert_fresh(run.step(0), "asked hi: sampled: hi", &run);
        assert_replay(run.step(1), "asked hi: sampled: hi", &["replayed"], &run);
        assert_eq!(run.out["samplings"], json!(["hi"]), "{run}");
        assert_eq!(case.starts("ask"), 1, "{}: {run}", sdk.name);
    }
}

/// `oncely mcp` driven directly: the test is the host, writing JSON-RPC lines to its
/// standard input and reading every line of its standard output.
struct Raw {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Every line read from standard output so far.
    seen: Vec<String>,
    stderr: Arc<Mutex<String>>,
}

impl Raw {
    fn start(wrapped: &[OsString]) -> Raw {
        let mut child = oncely()
            .args(&wrapped[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start oncely mcp");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    let mut all = stderr.lock().unwrap();
                    all.push_str(&line);
                    all.push('\n');
                }
            });
        }
        Raw {
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Reads standard output until the response to `id`.
    fn response(&mut self, id: &Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    let Ok(message) = serde_json::from_str::<Value>(&line) else {
                        continue;
                    };
                    if &message["id"] == id && message.get("method").is_none() {
                        return message;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "no response {id} within 20 s; stdout: {:?}\nstderr:\n{}",
                    self.seen,
                    self.stderr()
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "stdout ended before the response {id}; stdout: {:?}\nstderr:\n{}",
                    self.seen,
                    self.stderr()
                ),
            }
        }
    }

    fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.response(&id)
    }

    fn initialize(&mut self) {
        let init = self.request(
            json!(0),
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}}),
        );
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }

    fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Closes standard input and waits for the exit; then every stdout line is read.
    fn finish(&mut self) -> ExitStatus {
        self.close_stdin();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "oncely mcp did not exit within 20 s of its input's end; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(line);
        }
        status
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn call_params(prompt: &str, seconds: f64) -> Value {
    json!({"name": "render", "arguments": {"prompt": prompt, "seconds": seconds}})
}

fn text_of(response: &Value) -> &str {
    response["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result: {response}"))
}

/// Standard output carries JSON-RPC only, even when the server writes a line that is not
/// JSON to its own: oncely says so once on standard error and passes the valid messages
/// on; the ids the host chose (a number, a string) come back as they were; a repeat with
/// another id and other `_meta` is the same call, replayed; after the input's end the
/// exit status is 0.
#[test]
fn standard_output_carries_only_json_rpc() {
    for sdk in sdks() {
        let case = Case::new();
        let mut raw = Raw::start(&case.wrapper(&[], &sdk, &["--junk"]));
        raw.initialize();
        let listed = raw.request(json!("list"), "tools/list", json!({}));
        assert!(
            listed["result"]["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "render")),
            "{listed}"
        );
        let first = raw.request(json!(2), "tools/call", call_params("a", 0.0));
        assert_eq!(text_of(&first), "rendered a #1", "{first}");
        assert!(first["result"]["_meta"][REPLAY].is_null(), "{first}");
        let mut params = call_params("a", 0.0);
        params["_meta"] = json!({"trace": "another"});
        let again = raw.request(json!("again"), "tools/call", params);
        assert_eq!(text_of(&again), "rendered a #1", "{again}");
        assert_eq!(
            again["result"]["_meta"][REPLAY]["status"], "replayed",
            "{again}"
        );
        let status = raw.finish();
        let err = raw.stderr();
        assert_eq!(
            status.code(),
            Some(0),
            "{}: {status}; stderr:\n{err}",
            sdk.name
        );
        for line in &raw.seen {
            let message: Value = serde_json::from_str(line).unwrap_or_else(|e| {
                panic!("{}: a stdout line is not JSON ({e}): {line:?}", sdk.name)
            });
            assert_eq!(message["jsonrpc"], "2.0", "{line}");
        }
        assert!(
            !raw.seen.iter().any(|l| l.contains("stray print")),
            "{:?}",
            raw.seen
        );
        let mentions = err
            .lines()
            .filter(|l| {
                let l = l.to_lowercase();
                l.contains("stray print") || l.contains("not json") || l.contains("junk")
            })
            .count();
        assert_eq!(
            mentions, 1,
            "{}: the server's junk is reported once on stderr:\n{err}",
            sdk.name
        );
        assert_eq!(case.starts("render"), 1, "{}", case.log_text());
    }
}

/// The host closes the wrapper's input while a paid call runs: the wrapper lets it run to
/// its end, records it, answers it, stops the server and exits with 0; a new wrapper on
/// the same store replays it.
#[test]
fn input_closed_mid_call_the_call_is_finished_recorded_and_the_exit_is_0() {
    for sdk in sdks() {
        let case = Case::new();
        let wrapped = case.wrapper(&[], &sdk, &[]);
        let mut raw = Raw::start(&wrapped);
        raw.initialize();
        raw.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": call_params("raw", 2.0)}));
        let deadline = Instant::now() + Duration::from_secs(10);
        while case.starts("render") == 0 {
            assert!(
                Instant::now() < deadline,
                "the call never started: {}",
                raw.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        let closed = Instant::now();
        let status = raw.finish();
        let took = closed.elapsed();
        let err = raw.stderr();
        assert_eq!(
            status.code(),
            Some(0),
            "{}: {status}; stderr:\n{err}",
            sdk.name
        );
        assert_eq!(
            case.events("render", "done"),
            1,
            "{}: ran to its end: {}\n{err}",
            sdk.name,
            case.log_text()
        );
        assert_eq!(case.events("render", "cancelled"), 0, "{}", case.log_text());
        assert!(
            raw.seen.iter().any(|l| {
                serde_json::from_str::<Value>(l)
                    .is_ok_and(|m| m["id"] == 1 && text_of(&m) == "rendered raw #1")
            }),
            "{}: the call in flight is answered before the exit ({took:?}): {:?}\n{err}",
            sdk.name,
            raw.seen
        );
        assert_one_completed_render(&case, 0);

        let mut again = Raw::start(&wrapped);
        again.initialize();
        let replayed = again.request(json!(1), "tools/call", call_params("raw", 2.0));
        assert_eq!(text_of(&replayed), "rendered raw #1", "{replayed}");
        assert_eq!(
            replayed["result"]["_meta"][REPLAY]["status"], "replayed",
            "{replayed}"
        );
        assert_eq!(again.finish().code(), Some(0), "{}", again.stderr());
        assert_eq!(case.starts("render"), 1, "{}", case.log_text());
    }
}

/// A message over `max_body` (from `--config FILE`: `max_body = "1KiB"`) is answered with
/// a JSON-RPC error under its own id, never reaches the server, and the next message is
/// handled as usual.
#[test]
fn a_message_over_max_body_is_refused_with_its_id() {
    let Some(sdk) = Sdk::python() else { return };
    let case = Case::new();
    let config = case.dir.path().join("oncely.toml");
    std::fs::write(&config, "max_body = \"1KiB\"\n").unwrap();
    let config = config.to_str().unwrap().to_string();
    let mut raw = Raw::start(&case.wrapper(&["--config", &config], &sdk, &[]));
    raw.initialize();
    let big = "x".repeat(2000);
    let refused = raw.request(json!(7), "tools/call", call_params(&big, 0.0));
    assert_eq!(refused["id"], 7, "{refused}");
    assert!(
        refused["error"]["code"].is_i64() && refused.get("result").is_none(),
        "a JSON-RPC error: {refused}"
    );
    let ok = raw.request(json!(8), "tools/call", call_params("small", 0.0));
    assert_eq!(text_of(&ok), "rendered small #1", "{ok}");
    let status = raw.finish();
    assert_eq!(status.code(), Some(0), "{}", raw.stderr());
    assert_eq!(case.starts("render"), 1, "{}", case.log_text());
    assert!(!case.log_text().contains(&big), "the big call never ran");
}
