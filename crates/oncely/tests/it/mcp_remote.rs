//! `oncely mcp --url URL` through the real binary: the official Python SDK as the host
//! (`stdio_client` + `ClientSession`, oncely-mcp's `tests/py/stdio_host.py`) starts
//! `oncely mcp --store sqlite://TMP --url URL`, where URL is a remote Streamable HTTP
//! server written with each official SDK (`tests/py/http_server.py`,
//! `tests/node/http_server.mjs`) on 127.0.0.1 port 0. The server logs every tool
//! execution (and every session's `DELETE`) to a file, so that each test counts what
//! really ran.
//!
//! Needs `crates/oncely-mcp/tests/setup.sh` (the venv with `mcp`, and Node.js with the
//! TypeScript SDK); without them a test says so and passes, except under `CI`, where it
//! fails.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{oncely, run, stderr, stdout};
use crate::mcp_tasks::{mcp_tests, node};

const REPLAY: &str = "dev.oncely/replay";
/// The longest a host scenario may take.
const HOST_TIMEOUT: Duration = Duration::from_secs(40);

/// A remote server of one official SDK: its interpreter and script.
#[derive(Clone, Debug)]
struct ServerSdk {
    name: &'static str,
    program: PathBuf,
    script: PathBuf,
}

/// The servers of every SDK installed (each missing one says SKIPPED).
fn servers() -> Vec<ServerSdk> {
    let python = crate::mcp::python().map(|program| ServerSdk {
        name: "python",
        program,
        script: mcp_tests().join("py/http_server.py"),
    });
    let node = node().then(|| ServerSdk {
        name: "node",
        program: PathBuf::from("node"),
        script: mcp_tests().join("node/http_server.mjs"),
    });
    [python, node].into_iter().flatten().collect()
}

/// A running remote server; killed on drop.
struct Remote {
    child: Child,
    port: u16,
    url: String,
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test's temporary directory: the ledger and the server's execution log.
struct Case {
    _dir: tempfile::TempDir,
    store: String,
    log: PathBuf,
}

impl Case {
    fn new() -> Case {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("sqlite://{}", dir.path().join("mcp.db").display());
        let log = dir.path().join("executions.jsonl");
        Case {
            _dir: dir,
            store,
            log,
        }
    }

    /// `sdk`'s server, logging to this case's log (`--token TOKEN` when given).
    fn serve(&self, sdk: &ServerSdk, token: Option<&str>) -> Remote {
        self.serve_on(sdk, token, 0)
    }

    /// [`serve`](Self::serve) on `port` (0: an ephemeral one).
    fn serve_on(&self, sdk: &ServerSdk, token: Option<&str>, port: u16) -> Remote {
        let mut command = std::process::Command::new(&sdk.program);
        command.arg(&sdk.script).arg("--log").arg(&self.log);
        command.args(["--port", &port.to_string()]);
        if let Some(token) = token {
            command.args(["--token", token]);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start the {} server: {e}", sdk.name));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("the {} server exited", sdk.name))
            .unwrap();
        let port: u16 = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("the {} server printed {line:?}", sdk.name));
        // It says its port once bound, maybe before it listens.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the {} server never listened",
                sdk.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Remote {
            child,
            port,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }

    /// `oncely mcp --store STORE [OPTIONS] --url URL`, as a command line (the binary's
    /// path first).
    fn wrapper(&self, remote: &Remote, options: &[&str]) -> Vec<OsString> {
        let mut line: Vec<OsString> = vec![
            oncely().get_program().to_owned(),
            "mcp".into(),
            "--store".into(),
            self.store.clone().into(),
        ];
        line.extend(options.iter().map(OsString::from));
        line.extend(["--url".into(), remote.url.clone().into()]);
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

    /// How many `event` lines the server logged for `tool`.
    fn events(&self, tool: &str, event: &str) -> usize {
        self.logged()
            .iter()
            .filter(|e| e["tool"] == tool && e["event"] == event)
            .count()
    }

    fn starts(&self, tool: &str) -> usize {
        self.events(tool, "start")
    }

    /// How many sessions were ended with `DELETE`.
    fn deletes(&self) -> usize {
        self.logged()
            .iter()
            .filter(|e| e["event"] == "delete")
            .count()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `oncely ledger list --store STORE --json`.
    fn ledger(&self) -> Vec<Value> {
        let list = run(&["ledger", "list", "--json", "--store", &self.store]);
        assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
        let list: Value = serde_json::from_str(&stdout(&list)).unwrap();
        list.as_array().unwrap().clone()
    }
}

/// What the host printed (null when it failed), its exit status and its standard error
/// (oncely's logs pass through it).
struct HostRun {
    out: Value,
    ok: bool,
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

/// Runs the Python SDK's host with `scenario` in front of the command line `wrapped`,
/// passing the server the variables of `env`.
async fn host_run(scenario: &[&str], wrapped: &[OsString], env: &[(&str, &str)]) -> HostRun {
    let python = crate::mcp::python().expect("the Python SDK");
    let names: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
    let child = tokio::process::Command::new(python)
        .arg(mcp_tests().join("py/stdio_host.py"))
        .args(scenario)
        .arg("--")
        .args(wrapped)
        .envs(env.iter().copied())
        .env("HOST_ENV", names.join(","))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the host");
    let out = tokio::time::timeout(HOST_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the host did not finish {scenario:?}"))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    HostRun {
        out: serde_json::from_str(text.trim()).unwrap_or(Value::Null),
        ok: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// [`host_run`], which must succeed.
async fn host(scenario: &[&str], wrapped: &[OsString]) -> HostRun {
    let run = host_run(scenario, wrapped, &[]).await;
    assert!(run.ok, "the host failed {scenario:?}: {run}");
    run
}

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
    assert_eq!(outcome["text"], text, "the original's result: {run}");
    assert_eq!(outcome["isError"], false, "{run}");
    let status = replay(outcome);
    assert!(
        status.is_some_and(|s| statuses.contains(&s)),
        "_meta[{REPLAY:?}].status should be one of {statuses:?}, is {status:?}: {run}"
    );
}

/// The one ledger record of a guarded `render` call: completed, on the guard named by
/// the URL, with `repeats` repeats.
#[track_caller]
fn assert_one_completed_render(case: &Case, remote: &Remote, repeats: u64) {
    let records = case.ledger();
    assert_eq!(records.len(), 1, "one record: {records:?}");
    let record = &records[0];
    assert_eq!(
        record["route"],
        format!("stdio:{}#render", remote.url),
        "{record}"
    );
    assert_eq!(record["state"], "completed", "{record}");
    assert_eq!(record["repeats"], repeats, "{record}");
}

/// A paid tool called through two hosts, each with its own `oncely mcp --url` on one
/// store: it runs once on the remote server, the second host gets the replay; each
/// host's session is ended with `DELETE` when it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_tool_called_through_two_hosts_runs_once() {
    for sdk in servers() {
        let case = Case::new();
        let remote = case.serve(&sdk, None);
        let wrapped = case.wrapper(&remote, &[]);
        let first = host(&["render", "a"], &wrapped).await;
        assert_fresh(first.step(0), "rendered a #1", &first);
        let second = host(&["render", "a"], &wrapped).await;
        assert_replay(second.step(0), "rendered a #1", &["replayed"], &second);
        assert_eq!(case.starts("render"), 1, "{}: ran once: {second}", sdk.name);
        let key = &case.logged()[0]["key"];
        assert!(
            key.as_str().is_some_and(|k| k.starts_with("oncely-")),
            "{}: the guarded call carries the downstream key: {}",
            sdk.name,
            case.log_text()
        );
        assert_one_completed_render(&case, &remote, 1);
        assert_eq!(case.deletes(), 2, "{}: {}", sdk.name, case.log_text());
    }
}

/// A host that gives up on a slow paid call (its SDK times out and sends
/// `notifications/cancelled`) and asks again: the remote call ran once, to its end, and
/// the retry joined or replayed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_gives_up_and_asks_again_pays_once() {
    for sdk in servers() {
        let case = Case::new();
        let remote = case.serve(&sdk, None);
        let run = host(&["giveup"], &case.wrapper(&remote, &[])).await;
        assert_eq!(run.step(0)["error"]["kind"], "timeout", "{run}");
        let text = run.step(1)["text"].clone();
        assert!(
            text.as_str()
                .is_some_and(|t| t.starts_with("rendered slow #")),
            "{run}"
        );
        assert_replay(
            run.step(1),
            text.as_str().unwrap(),
            &["joined", "replayed"],
            &run,
        );
        assert_eq!(case.starts("render"), 1, "{}: ran once: {run}", sdk.name);
        assert_eq!(case.events("render", "cancelled"), 0, "{}", case.log_text());
        assert_eq!(case.events("render", "done"), 1, "{}", case.log_text());
        assert_one_completed_render(&case, &remote, 1);
    }
}

/// A tool that samples during its call (`sampling/createMessage` on the call's own event
/// stream, answered by the host's sampling callback) works through the 2025-11-25
/// revision; its repeat is replayed without sampling again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_samples_during_its_call_works_on_2025_11_25() {
    for sdk in servers() {
        let case = Case::new();
        let remote = case.serve(&sdk, None);
        let run = host(&["sampling"], &case.wrapper(&remote, &[])).await;
        assert_eq!(run.out["protocol"], "2025-11-25", "{run}");
        assert_fresh(run.step(0), "asked hi: sampled: hi", &run);
        assert_replay(run.step(1), "asked hi: sampled: hi", &["replayed"], &run);
        assert_eq!(run.out["samplings"], json!(["hi"]), "{run}");
        assert_eq!(case.starts("ask"), 1, "{}: {run}", sdk.name);
    }
}

/// `--header 'Authorization: Bearer ${TOKEN}'` reaches a server that refuses requests
/// without it, with TOKEN read from the environment the host gives; the token is in no
/// log line. Without the header, the host cannot even initialize.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_from_the_environment_reaches_the_server() {
    const TOKEN: &str = "tok-5ecret-7f3a";
    for sdk in servers() {
        let case = Case::new();
        let remote = case.serve(&sdk, Some(TOKEN));
        let header = ["--header", "Authorization: Bearer ${TOKEN}"];
        let wrapped = case.wrapper(&remote, &header);
        let run = host_run(&["render", "a"], &wrapped, &[("TOKEN", TOKEN)]).await;
        assert!(run.ok, "{}: {run}", sdk.name);
        assert_fresh(run.step(0), "rendered a #1", &run);
        assert_eq!(
            case.logged()[0]["auth"],
            format!("Bearer {TOKEN}"),
            "{}: {}",
            sdk.name,
            case.log_text()
        );
        assert!(
            !run.stderr.contains(TOKEN),
            "{}: the token is in a log line:\n{}",
            sdk.name,
            run.stderr
        );

        let refused = host_run(&["render", "b"], &case.wrapper(&remote, &[]), &[]).await;
        assert!(
            !refused.ok || refused.step(0)["error"].is_object(),
            "{}: a request without the token is refused: {refused}",
            sdk.name
        );
        assert!(
            refused.stderr.contains("401"),
            "{}: the refusal says the server's status: {refused}",
            sdk.name
        );
        assert_eq!(case.starts("render"), 1, "{}", case.log_text());
    }
}

/// `--url` with `-- COMMAND`, a URL that is not http(s), a `--header` without `:` or
/// naming an unset variable: exit 2 with a message that names the problem, and never the
/// header's value.
#[test]
fn bad_remote_arguments_exit_2_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("mcp.db").display());
    let url = "http://127.0.0.1:9/mcp";
    let cases: &[(&[&str], &str)] = &[
        (&["--url", url, "--", "some-server"], "--url and -- COMMAND"),
        (&["--url", "ftp://example.com/mcp"], "http:// or https://"),
        (&["--url", "not a url"], "http:// or https://"),
        (
            &["--url", url, "--header", "Authorization Bearer s3cret-v"],
            "':'",
        ),
        (
            &[
                "--url",
                url,
                "--header",
                "Authorization: Bearer ${ONCELY_TEST_UNSET_VAR}",
            ],
            "ONCELY_TEST_UNSET_VAR",
        ),
        (
            &["--header", "A: b", "--", "some-server"],
            "--header is for --url",
        ),
        (&[], "no MCP server given"),
    ];
    for (args, says) in cases {
        let out = oncely()
            .args(["mcp", "--store", &store])
            .args(*args)
            .env_remove("ONCELY_TEST_UNSET_VAR")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: should say {says:?}: {err}");
        assert!(!err.contains("s3cret"), "{args:?}: a header's value: {err}");
        assert!(stdout(&out).is_empty(), "{args:?}: nothing on stdout");
    }
}

/// The host closes the wrapper's input while a paid call runs: the call runs to its end
/// on the remote server, is answered and recorded, the remote session is ended with
/// `DELETE`, and the exit status is 0; a new wrapper on the store replays it.
#[test]
fn input_closed_mid_call_the_call_is_recorded_the_session_ended_and_the_exit_is_0() {
    for sdk in servers() {
        let case = Case::new();
        let remote = case.serve(&sdk, None);
        let wrapped = case.wrapper(&remote, &[]);
        let mut raw = Raw::start(&wrapped);
        raw.initialize();
        raw.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "render", "arguments": {"prompt": "raw", "seconds": 2.0}}}));
        let deadline = Instant::now() + Duration::from_secs(10);
        while case.starts("render") == 0 {
            assert!(Instant::now() < deadline, "never started: {}", raw.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        let (status, seen) = raw.finish();
        let err = raw.stderr();
        assert_eq!(status, Some(0), "{}: stderr:\n{err}", sdk.name);
        assert_eq!(
            case.events("render", "done"),
            1,
            "{}: ran to its end: {}\n{err}",
            sdk.name,
            case.log_text()
        );
        assert_eq!(case.events("render", "cancelled"), 0, "{}", case.log_text());
        assert!(
            seen.iter()
                .any(|m| m["id"] == 1 && m["result"]["content"][0]["text"] == "rendered raw #1"),
            "{}: the call in flight is answered before the exit: {seen:?}\n{err}",
            sdk.name
        );
        assert_one_completed_render(&case, &remote, 0);
        assert_eq!(case.deletes(), 1, "{}: {}", sdk.name, case.log_text());

        let mut again = Raw::start(&wrapped);
        again.initialize();
        again.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "render", "arguments": {"prompt": "raw", "seconds": 2.0}}}));
        let replayed = again.response(1);
        assert_eq!(
            replayed["result"]["_meta"][REPLAY]["status"], "replayed",
            "{replayed}"
        );
        assert_eq!(again.finish().0, Some(0), "{}", again.stderr());
        assert_eq!(case.starts("render"), 1, "{}", case.log_text());
    }
}

/// A remote server that restarts (and so forgets the session it gave) answers the next
/// request 404: `oncely mcp` starts a new session with the host's `initialize` and sends
/// the request again; the host sees nothing of it.
#[test]
fn a_restarted_server_gets_a_new_session_and_the_calls_go_on() {
    for sdk in servers() {
        let case = Case::new();
        let remote = case.serve(&sdk, None);
        let mut raw = Raw::start(&case.wrapper(&remote, &[]));
        raw.initialize();
        let call = |id: i64, prompt: &str| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "render", "arguments": {"prompt": prompt}}})
        };
        raw.send(&call(1, "before"));
        let before = raw.response(1);
        assert_eq!(
            before["result"]["content"][0]["text"], "rendered before #1",
            "{before}"
        );
        let port = remote.port;
        drop(remote);
        let _restarted = case.serve_on(&sdk, None, port);
        raw.send(&call(2, "after"));
        let after = raw.response(2);
        assert_eq!(
            after["result"]["content"][0]["text"],
            "rendered after #1",
            "{}: {after}\n{}",
            sdk.name,
            raw.stderr()
        );
        raw.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}));
        let listed = raw.response(3);
        assert!(listed["result"]["tools"].is_array(), "{listed}");
        assert_eq!(raw.finish().0, Some(0), "{}", raw.stderr());
        assert_eq!(case.starts("render"), 2, "{}", case.log_text());
        assert_eq!(case.ledger().len(), 2, "{}", sdk.name);
    }
}

/// Every revision an `[[mcp]]` endpoint speaks reaches the remote server through
/// `oncely mcp --url` and is guarded: the handshake revisions (the session, the
/// negotiated `MCP-Protocol-Version`) on each SDK's server, and the stateless 2026-07-28
/// (no handshake; `Mcp-Method` and `Mcp-Name` from each message) on the Python SDK's,
/// which serves both eras on one endpoint.
#[test]
fn every_revision_reaches_the_remote_server_and_is_guarded() {
    const STATELESS: &str = "2026-07-28";
    for sdk in servers() {
        let mut revisions = vec!["2025-03-26", "2025-06-18", "2025-11-25"];
        if sdk.name == "python" {
            revisions.push(STATELESS);
        }
        for revision in revisions {
            let case = Case::new();
            let remote = case.serve(&sdk, None);
            let mut raw = Raw::start(&case.wrapper(&remote, &[]));
            let mut params = json!({"name": "render", "arguments": {"prompt": revision}});
            if revision == STATELESS {
                params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": revision,
                    "io.modelcontextprotocol/clientCapabilities": {}});
            } else {
                let init = raw.initialize_as(revision);
                assert_eq!(init["result"]["protocolVersion"], revision, "{init}");
            }
            for id in [1, 2] {
                raw.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": params}));
            }
            let (first, again) = (raw.response(1), raw.response(2));
            let what = format!("{} server, {revision}", sdk.name);
            let text = format!("rendered {revision} #1");
            assert_eq!(
                first["result"]["content"][0]["text"], text,
                "{what}: {first}"
            );
            assert_eq!(
                again["result"]["content"][0]["text"], text,
                "{what}: {again}"
            );
            // Sent at once, either may be the original: the other is answered by the guard.
            let replays = [&first, &again]
                .iter()
                .filter(|m| m["result"]["_meta"][REPLAY]["status"].is_string())
                .count();
            assert_eq!(replays, 1, "{what}: one is the guard's: {first}\n{again}");
            assert_eq!(raw.finish().0, Some(0), "{what}: {}", raw.stderr());
            assert_eq!(case.starts("render"), 1, "{what}: {}", case.log_text());
        }
    }
}

/// `oncely mcp` driven directly: the test is the host, writing JSON-RPC lines to its
/// standard input and reading every message of its standard output.
pub(crate) struct Raw {
    child: Child,
    lines: Receiver<String>,
    /// Messages read and not asked for yet.
    unread: Vec<Value>,
    stderr: Arc<Mutex<String>>,
}

impl Raw {
    pub(crate) fn start(wrapped: &[OsString]) -> Raw {
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
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let all = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut all = all.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        Raw {
            child,
            lines,
            unread: Vec::new(),
            stderr,
        }
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub(crate) fn send(&mut self, message: &Value) {
        let stdin = self.child.stdin.as_mut().expect("stdin still open");
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .unwrap();
    }

    /// The response to `id` (read from standard output when it was not yet).
    pub(crate) fn response(&mut self, id: i64) -> Value {
        let is_it = |m: &Value| m["id"] == id && m.get("method").is_none();
        if let Some(at) = self.unread.iter().position(is_it) {
            return self.unread.remove(at);
        }
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("no response {id} ({e}): {}", self.stderr()));
            let message: Value = serde_json::from_str(&line).unwrap();
            if is_it(&message) {
                return message;
            }
            self.unread.push(message);
        }
    }

    fn initialize(&mut self) {
        self.initialize_as("2025-11-25");
    }

    /// The handshake in `revision`: the server's answer to `initialize`.
    pub(crate) fn initialize_as(&mut self, revision: &str) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": revision, "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}}}));
        let init = self.response(0);
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        init
    }

    /// Closes standard input and waits for the exit: its code and every message written.
    pub(crate) fn finish(&mut self) -> (Option<i32>, Vec<Value>) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "no exit within 20 s: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut seen = std::mem::take(&mut self.unread);
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            seen.extend(serde_json::from_str::<Value>(&line).ok());
        }
        (status.code(), seen)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
