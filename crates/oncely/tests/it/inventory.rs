//! `oncely inventory` through the real binary: three public OpenAPI documents (the
//! OpenAPI Initiative's examples in `data/openapi/`, one YAML, two JSON, one of them 3.1),
//! a real MCP server on 127.0.0.1 written with the official Python SDK
//! (`data/shop_server.py`, answering with an event stream and with JSON), local stdio MCP
//! servers started from `--mcp-command` (oncely-mcp's `tests/py/stdio_server.py`, of the
//! same SDK, a scripted one that tests each rule of the exchange, and
//! `data/listed_tools_server.py`, which lists the tools a test writes: key arguments and
//! descriptions that ask for a new key with every request), a config, and a real SQLite
//! ledger. The starting config `--write-config` writes must pass
//! `oncely check-config`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use oncely_core::{ClaimSpec, Class, Completion, Fingerprint, Identity, StoredResponse};
use oncely_store::{Claim, ManualClock, StoreOptions};
use serde_json::Value;

use crate::common::{assert_usage_error, run, stderr, stdout};

fn data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it/data")
        .join(name)
        .display()
        .to_string()
}

fn documents() -> [String; 3] {
    [
        data("openapi/petstore-expanded.yaml"),
        data("openapi/uspto.json"),
        data("openapi/tictactoe.json"),
    ]
}

fn json(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// The operation `METHOD PATH` (or the tool `name`) of an inventory.
#[track_caller]
fn op<'a>(inventory: &'a Value, what: &str) -> &'a Value {
    inventory["operations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| match o.get("tool") {
            Some(t) => t == what,
            None => {
                format!(
                    "{} {}",
                    o["method"].as_str().unwrap(),
                    o["path"].as_str().unwrap()
                ) == what
            }
        })
        .unwrap_or_else(|| panic!("no {what} in {inventory:#}"))
}

fn gap_kinds(op: &Value) -> Vec<&str> {
    op["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["gap"].as_str().unwrap())
        .collect()
}

fn gap<'a>(op: &'a Value, kind: &str) -> &'a Value {
    op["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gap"] == kind)
        .unwrap_or_else(|| panic!("no {kind} gap in {op:#}"))
}

fn inventory(args: &[&str]) -> Value {
    let mut all = vec!["inventory", "--json"];
    all.extend_from_slice(args);
    json(&run(&all))
}

fn openapi_args(docs: &[String]) -> Vec<&str> {
    docs.iter()
        .flat_map(|d| ["--openapi", d.as_str()])
        .collect()
}

#[track_caller]
fn assert_checks(config: &Path) {
    let o = run(&["check-config", config.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "check-config: {}\n{}",
        stderr(&o),
        std::fs::read_to_string(config).unwrap()
    );
}

#[test]
fn public_openapi_documents_get_classes_gaps_and_a_starting_config_that_checks() {
    let docs = documents();
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("oncely.toml");
    let mut args = openapi_args(&docs);
    args.extend(["--write-config", written.to_str().unwrap()]);
    let inv = inventory(&args);

    // The contract's shape: every operation, and exactly these members.
    let ops = inv["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 4 + 3 + 3, "{inv:#}");
    for o in ops {
        let mut keys: Vec<&str> = o.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "class",
                "configured",
                "gaps",
                "key",
                "method",
                "path",
                "reconcile",
                "replay",
                "source",
                "window"
            ],
            "{o:#}"
        );
        assert_eq!(o["configured"], false);
        assert!(docs.iter().any(|d| o["source"] == d.as_str()));
    }

    // Classes proposed from methods and words.
    for (what, class) in [
        ("GET /pets", "read"),
        ("POST /pets", "write"),
        ("GET /pets/{id}", "read"),
        ("DELETE /pets/{id}", "action"),
        ("GET /", "read"),
        ("GET /{dataset}/{version}/fields", "read"),
        ("POST /{dataset}/{version}/records", "write"),
        ("GET /board", "read"),
        ("GET /board/{row}/{column}", "read"),
        ("PUT /board/{row}/{column}", "write"),
    ] {
        assert_eq!(op(&inv, what)["class"], class, "{what}");
    }

    // Gaps: reads have none; every other operation is unguarded; the action has no
    // reconcile either. Each gap carries the config lines that close it.
    for o in ops.iter().filter(|o| o["class"] == "read") {
        assert_eq!(gap_kinds(o), Vec::<&str>::new(), "{o:#}");
        assert_eq!(o["key"], Value::Null);
    }
    let post = op(&inv, "POST /pets");
    assert_eq!(gap_kinds(post), ["unguarded"]);
    assert_eq!(post["replay"], "executes again");
    assert_eq!(post["key"], Value::Null);
    assert_eq!(post["window"], Value::Null);
    let fix = gap(post, "unguarded")["fix"].as_str().unwrap();
    assert!(fix.contains("[[routes]]") && fix.contains("method = \"POST\""));
    assert!(fix.contains("path = \"/pets\"") && fix.contains("class = \"write\""));
    let delete = op(&inv, "DELETE /pets/{id}");
    assert_eq!(gap_kinds(delete), ["unguarded", "no_reconcile"]);
    assert!(gap(delete, "unguarded")["fix"]
        .as_str()
        .unwrap()
        .contains("class = \"action\""));
    assert!(gap(delete, "no_reconcile")["fix"]
        .as_str()
        .unwrap()
        .starts_with("reconcile = \"GET /pets?reference={key}\""));

    // The starting config passes check-config, and with it every gap but the missing
    // reconcile (which only the upstream's owner can fill in) is closed.
    assert_checks(&written);
    let text = std::fs::read_to_string(&written).unwrap();
    assert!(
        text.contains("upstream = \"https://petstore.swagger.io/v2\""),
        "{text}"
    );
    let mut again = openapi_args(&docs);
    again.extend(["--config", written.to_str().unwrap()]);
    let inv = inventory(&again);
    for o in inv["operations"].as_array().unwrap() {
        if o["class"] == "read" {
            assert_eq!(o["configured"], false, "{o:#}");
            continue;
        }
        assert_eq!(o["configured"], true, "{o:#}");
        assert_eq!(o["key"], "header-or-fingerprint");
        assert_eq!(o["window"], "3h");
        assert!(o["replay"]
            .as_str()
            .unwrap()
            .contains("stored first response"));
        let expected: &[&str] = if o["class"] == "action" {
            &["no_reconcile"]
        } else {
            &[]
        };
        assert_eq!(gap_kinds(o), expected, "{o:#}");
    }
    assert_eq!(op(&inv, "DELETE /pets/{id}")["class"], "action");
    assert_eq!(op(&inv, "PUT /board/{row}/{column}")["class"], "write");

    // The table for a terminal says the same.
    let mut table_args = vec!["inventory"];
    table_args.extend(openapi_args(&docs));
    let o = run(&table_args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(table.contains("DELETE /pets/{id}"), "{table}");
    assert!(table.contains("action (proposed)"), "{table}");
    assert!(table.contains("5 gap(s)"), "{table}");
    assert!(
        table.contains("    path = \"/{dataset}/{version}/records\""),
        "{table}"
    );
}

/// Puts a completed first attempt of `route` in the ledger that took `took`.
async fn completed(path: &Path, route: &str, key: &str, took: Duration) {
    let clock = ManualClock::new();
    let store = oncely_store::open(
        &format!("sqlite://{}", path.display()),
        StoreOptions {
            clock: Arc::new(clock.clone()),
            ..StoreOptions::default()
        },
    )
    .await
    .unwrap();
    let claim = store
        .claim(&ClaimSpec {
            identity: Identity::new(
                "alice".into(),
                route.to_owned(),
                Class::Write,
                Some(key.to_owned()),
                Fingerprint([7; 32]),
                None,
            ),
            owner: "test/1".into(),
            lease: Duration::from_secs(3600),
        })
        .await
        .unwrap();
    let Claim::Owned(record) = claim else {
        panic!("{claim:?}")
    };
    clock.advance(took);
    store
        .complete(
            &record.fence().unwrap(),
            Completion {
                response: StoredResponse {
                    status: 201,
                    headers: vec![],
                    body: Some(b"ok".to_vec().into()),
                },
                units: 1,
                window: Duration::from_secs(3600),
                replay_until: None,
                provider_request_id: None,
                trace: None,
            },
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_and_the_ledger_say_what_is_guarded_how_and_what_is_too_slow() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    // POST /pets: one call took 45 s (an assistant gave up long before), one 2 s.
    completed(&db, "POST /pets", "k1", Duration::from_secs(45)).await;
    completed(&db, "POST /pets", "k2", Duration::from_secs(2)).await;
    // DELETE /pets/{id}: fast.
    completed(&db, "DELETE /pets/{id}", "k3", Duration::from_secs(1)).await;
    let config = dir.path().join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            r#"store = "sqlite://{}"
upstream = "http://127.0.0.1:3000"

[[routes]]
method = "POST"
path = "/pets"
class = "write"
key = "header"
window = "10m"

[[routes]]
method = "DELETE"
path = "/pets/{{id}}"
class = "action"
reconcile = "GET /pets?reference={{key}}"
reconcile_after = "30s"

[[routes]]
method = "PUT"
path = "/board/{{row}}/{{column}}"
key = "none"

[[routes]]
method = "POST"
path = "/{{dataset}}/{{version}}/records"
class = "read"
"#,
            db.display()
        ),
    )
    .unwrap();
    let docs = documents();
    let mut args = openapi_args(&docs);
    args.extend(["--config", config.to_str().unwrap()]);
    let inv = inventory(&args);

    let post = op(&inv, "POST /pets");
    assert_eq!(post["configured"], true);
    assert_eq!(post["class"], "write");
    assert_eq!(post["key"], "header");
    assert_eq!(post["window"], "10m");
    assert_eq!(gap_kinds(post), ["slow_not_job"]);
    let slow = gap(post, "slow_not_job");
    assert!(
        slow["fix"].as_str().unwrap().starts_with("class = \"job\""),
        "{slow:#}"
    );
    assert!(
        slow["detail"].as_str().unwrap().contains("1 of 2"),
        "{slow:#}"
    );

    let delete = op(&inv, "DELETE /pets/{id}");
    assert_eq!(delete["configured"], true);
    assert_eq!(delete["class"], "action");
    assert_eq!(gap_kinds(delete), Vec::<&str>::new());
    assert_eq!(delete["reconcile"], "GET /pets?reference={key} after 30s");

    // A route that keys nothing leaves its write unguarded.
    let put = op(&inv, "PUT /board/{row}/{column}");
    assert_eq!(put["configured"], true);
    assert_eq!(put["key"], Value::Null);
    assert_eq!(gap_kinds(put), ["unguarded"]);
    assert!(gap(put, "unguarded")["fix"]
        .as_str()
        .unwrap()
        .contains("key = \"header-or-fingerprint\""));

    // A POST its owner configured as a read (a search) is a read: no gap.
    let search = op(&inv, "POST /{dataset}/{version}/records");
    assert_eq!(search["configured"], true);
    assert_eq!(search["class"], "read");
    assert_eq!(search["key"], Value::Null);
    assert_eq!(gap_kinds(search), Vec::<&str>::new());

    // Another ledger (`--store` wins over the config's) observed nothing slow.
    let empty = dir.path().join("empty.db");
    drop(
        oncely_store::open(
            &format!("sqlite://{}", empty.display()),
            StoreOptions::default(),
        )
        .await
        .unwrap(),
    );
    let empty = format!("sqlite://{}", empty.display());
    let inv = inventory(&[
        "--openapi",
        &docs[0],
        "--config",
        config.to_str().unwrap(),
        "--store",
        &empty,
    ]);
    assert_eq!(gap_kinds(op(&inv, "POST /pets")), Vec::<&str>::new());

    // A ledger that is not there is an error, not a new empty ledger.
    let nowhere = dir.path().join("nowhere.db");
    let o = run(&[
        "inventory",
        "--openapi",
        &docs[0],
        "--store",
        &format!("sqlite://{}", nowhere.display()),
    ]);
    assert_usage_error(&o, "no ledger at");
    assert!(!nowhere.exists());
}

/// `data/shop_server.py`; killed on drop.
struct Shop {
    child: Child,
    url: String,
}

impl Shop {
    fn start(python: &Path, json: bool) -> Shop {
        let mut cmd = Command::new(python);
        cmd.arg(data("shop_server.py"));
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .expect("start shop_server.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = loop {
            let line = lines.next().expect("shop_server.py exited").unwrap();
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
        Shop {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn mcp_tools_are_classed_by_their_annotations_and_names_over_sse_and_json() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let sse = Shop::start(&python, false);
    let plain = Shop::start(&python, true);
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("oncely.toml");
    let inv = inventory(&[
        "--mcp",
        &sse.url,
        "--mcp",
        &plain.url,
        "--write-config",
        written.to_str().unwrap(),
    ]);
    let ops = inv["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 8, "{inv:#}");
    for url in [&sse.url, &plain.url] {
        let of = |tool: &str| {
            ops.iter()
                .find(|o| o["source"] == url.as_str() && o["tool"] == tool)
                .unwrap_or_else(|| panic!("no {tool} from {url}"))
        };
        for (tool, class) in [
            ("get_invoice", "read"),
            ("send_invoice", "action"),
            ("cancel_subscription", "action"),
            ("save_draft", "write"),
        ] {
            let o = of(tool);
            let mut keys: Vec<&str> = o.as_object().unwrap().keys().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                [
                    "class",
                    "configured",
                    "gaps",
                    "key",
                    "key_arguments",
                    "method",
                    "reconcile",
                    "replay",
                    "source",
                    "tool",
                    "transport",
                    "window"
                ]
            );
            assert_eq!(o["transport"], "http");
            assert_eq!(o["class"], class, "{tool}");
            assert_eq!(o["configured"], false);
            let expected: &[&str] = if class == "read" { &[] } else { &["unguarded"] };
            assert_eq!(gap_kinds(o), expected, "{tool}");
        }
        let fix = gap(of("send_invoice"), "unguarded")["fix"]
            .as_str()
            .unwrap();
        assert!(fix.contains("[[mcp]]") && fix.contains(&format!("upstream = \"{url}\"")));
        assert!(fix.contains("actions = [\"send_invoice\"]"), "{fix}");
    }

    // The starting config guards both servers with those classes and checks.
    assert_checks(&written);
    let inv = inventory(&[
        "--mcp",
        &sse.url,
        "--mcp",
        &plain.url,
        "--config",
        written.to_str().unwrap(),
    ]);
    for o in inv["operations"].as_array().unwrap() {
        assert_eq!(o["configured"], true, "{o:#}");
        assert_eq!(gap_kinds(o), Vec::<&str>::new(), "{o:#}");
        if o["class"] == "read" {
            assert_eq!(o["tool"], "get_invoice");
            assert_eq!(o["key"], Value::Null);
        } else {
            assert_eq!(o["key"], "fingerprint");
            assert_eq!(o["window"], "3h");
        }
    }
    assert_eq!(op(&inv, "send_invoice")["class"], "action");
    assert_eq!(op(&inv, "cancel_subscription")["class"], "action");
    assert_eq!(op(&inv, "save_draft")["class"], "write");
}

#[test]
fn bad_documents_and_unreachable_servers_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let o = run(&["inventory", "--openapi", missing.to_str().unwrap()]);
    assert_usage_error(&o, "missing.yaml");

    let swagger = dir.path().join("swagger.json");
    std::fs::write(&swagger, r#"{"swagger": "2.0", "paths": {}}"#).unwrap();
    let o = run(&["inventory", "--openapi", swagger.to_str().unwrap()]);
    assert_usage_error(&o, "Swagger 2.0");

    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "openapi: 3.1.0\npaths: [\n").unwrap();
    let o = run(&["inventory", "--openapi", broken.to_str().unwrap()]);
    assert_usage_error(&o, "YAML");

    let o = run(&["inventory", "--mcp", "http://127.0.0.1:1/mcp"]);
    assert_usage_error(&o, "http://127.0.0.1:1/mcp");

    let o = run(&["inventory"]);
    assert_usage_error(&o, "--openapi");
    assert_usage_error(&o, "--mcp-command");

    // A good document with one bad one is still a failure, and writes nothing.
    let written = dir.path().join("out.toml");
    let o = run(&[
        "inventory",
        "--openapi",
        &documents()[0],
        "--openapi",
        swagger.to_str().unwrap(),
        "--write-config",
        written.to_str().unwrap(),
    ]);
    assert_usage_error(&o, "swagger.json");
    assert!(!written.exists());
}

/// A word a POSIX shell reads back as itself (for `--mcp-command`).
fn sh(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The command line of oncely-mcp's stdio server of the Python SDK (`render` paid,
/// `lookup` readOnlyHint, `ask`), logging to `log`.
fn stdio_server(python: &Path, log: &Path) -> String {
    let server =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../oncely-mcp/tests/py/stdio_server.py");
    format!(
        "{} {} --log {}",
        sh(python.to_str().unwrap()),
        sh(server.to_str().unwrap()),
        sh(log.to_str().unwrap())
    )
}

#[test]
fn a_stdio_server_of_the_python_sdk_is_listed_with_the_oncely_mcp_fix() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let command = stdio_server(&python, &log);
    let fix = format!("oncely mcp -- {command}");

    let inv = inventory(&["--mcp-command", &command]);
    let ops = inv["operations"].as_array().unwrap();
    let mut tools: Vec<&str> = ops.iter().map(|o| o["tool"].as_str().unwrap()).collect();
    tools.sort_unstable();
    assert_eq!(tools, ["ask", "lookup", "render"], "{inv:#}");
    for o in ops {
        let mut keys: Vec<&str> = o.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "class",
                "configured",
                "gaps",
                "key",
                "key_arguments",
                "method",
                "reconcile",
                "replay",
                "source",
                "tool",
                "transport",
                "window"
            ]
        );
        assert_eq!(o["source"], command.as_str());
        assert_eq!(o["transport"], "stdio");
        assert_eq!(o["method"], "tools/call");
        assert_eq!(o["configured"], false);
        assert_eq!(o["key"], Value::Null);
    }
    let lookup = op(&inv, "lookup");
    assert_eq!(lookup["class"], "read");
    assert_eq!(gap_kinds(lookup), Vec::<&str>::new());
    for tool in ["render", "ask"] {
        let o = op(&inv, tool);
        assert_eq!(o["class"], "write", "{tool}");
        assert_eq!(o["replay"], "executes again");
        assert_eq!(gap_kinds(o), ["unguarded"]);
        let g = gap(o, "unguarded");
        assert!(
            g["detail"].as_str().unwrap().contains("stdio server"),
            "{g:#}"
        );
        let text = g["fix"].as_str().unwrap();
        assert_eq!(text.lines().next(), Some(fix.as_str()), "{text}");
        assert!(
            text.contains(
                "wrap the server: put `oncely mcp --` before its command in the host's config"
            ),
            "{text}"
        );
        assert!(!text.contains("[[mcp]]"), "{text}");
    }

    // The table says the same, under the command.
    let o = run(&["inventory", "--mcp-command", &command]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let table = stdout(&o);
    let mut lines = table.lines();
    assert_eq!(lines.next(), Some(command.as_str()), "{table}");
    let row = |tool: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("tool {tool} ")))
            .unwrap_or_else(|| panic!("no {tool} in {table}"))
    };
    assert!(row("lookup").contains("read (proposed)"), "{table}");
    assert!(row("render").contains("write (proposed)"), "{table}");
    assert!(row("render").contains("executes again"), "{table}");
    assert!(row("ask").contains("write (proposed)"), "{table}");
    assert!(table.contains("2 gap(s)"), "{table}");
    assert!(
        table.contains("- tool render (unguarded): a write tool of a stdio server"),
        "{table}"
    );
    assert!(table.contains(&format!("\n    {fix}\n")), "{table}");

    // Listing executes nothing.
    assert_eq!(std::fs::read_to_string(&log).unwrap_or_default(), "");
}

/// A stdio MCP server scripted to test the client: a line that is not JSON-RPC first; on
/// `initialize` a notification, a `roots/list` request it waits for the answer to (logged),
/// a line that is JSON but no message, then the answer; `tools/list` in two pages. It logs
/// its pid, what it is sent, and the end of its input; `stubborn` then sleeps instead of
/// exiting.
const SCRIPTED: &str = r#"
import json, os, sys, time
log_path, mode = sys.argv[1], sys.argv[2]

def log(**entry):
    with open(log_path, "a") as f:
        f.write(json.dumps(entry) + "\n")

def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

log(event="pid", pid=os.getpid())
print("starting up: this line is not JSON", flush=True)
PAGES = [
    [{"name": "get_balance", "annotations": {"readOnlyHint": True}}],
    [
        {"name": "send_invoice"},
        {"name": "wipe", "annotations": {"destructiveHint": True}},
        {"name": "save_draft", "annotations": {"title": "Save a draft"}},
    ],
]
while True:
    line = sys.stdin.readline()
    if not line:
        break
    m = json.loads(line)
    method = m.get("method")
    log(event="got", method=method, id=m.get("id"), params=m.get("params"))
    if method == "initialize":
        send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hello"}})
        send({"jsonrpc": "2.0", "id": "srv-1", "method": "roots/list", "params": {}})
        log(event="reply", reply=json.loads(sys.stdin.readline()))
        print("42", flush=True)
        send({"jsonrpc": "2.0", "id": m["id"], "result": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "scripted", "version": "1"},
        }})
    elif method == "tools/list":
        page = 1 if (m.get("params") or {}).get("cursor") == "p2" else 0
        result = {"tools": PAGES[page]}
        if page == 0:
            result["nextCursor"] = "p2"
        send({"jsonrpc": "2.0", "id": m["id"], "result": result})
    elif "id" in m:
        send({"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32601, "message": "no"}})
log(event="eof")
if mode == "stubborn":
    time.sleep(60)
"#;

fn log_entries(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn alive(pid: u64) -> bool {
    let stat = format!("/proc/{pid}/stat");
    // A zombie is dead.
    std::fs::read_to_string(stat).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

#[test]
fn the_stdio_client_answers_server_requests_skips_what_is_not_an_answer_and_reads_every_page() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("scripted server.py");
    std::fs::write(&script, SCRIPTED).unwrap();
    let log = dir.path().join("log");
    let command = format!(
        "{} {} {} polite",
        sh(python.to_str().unwrap()),
        sh(script.to_str().unwrap()),
        sh(log.to_str().unwrap())
    );
    let written = dir.path().join("oncely.toml");
    let inv = inventory(&[
        "--mcp-command",
        &command,
        "--write-config",
        written.to_str().unwrap(),
    ]);
    for (tool, class) in [
        ("get_balance", "read"),
        ("send_invoice", "action"),
        ("wipe", "action"),
        ("save_draft", "write"),
    ] {
        let o = op(&inv, tool);
        assert_eq!(o["class"], class, "{tool}");
        assert_eq!(o["transport"], "stdio");
    }
    assert_eq!(inv["operations"].as_array().unwrap().len(), 4, "{inv:#}");
    let fix = gap(op(&inv, "send_invoice"), "unguarded")["fix"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        fix.starts_with(&format!("oncely mcp --action send_invoice -- {command}\n")),
        "{fix}"
    );
    assert!(
        fix.contains("put `oncely mcp --action send_invoice --` before its command"),
        "{fix}"
    );
    assert!(gap(op(&inv, "save_draft"), "unguarded")["fix"]
        .as_str()
        .unwrap()
        .starts_with(&format!("oncely mcp -- {command}\n")));

    // What the server was sent: initialize as the HTTP client sends it, the answer to its
    // request, the notification, two pages; then its input ended and it exited.
    let entries = log_entries(&log);
    let got: Vec<&str> = entries
        .iter()
        .filter(|e| e["event"] == "got")
        .map(|e| e["method"].as_str().unwrap_or("(an answer)"))
        .collect();
    assert_eq!(
        got,
        [
            "initialize",
            "notifications/initialized",
            "tools/list",
            "tools/list"
        ],
        "{entries:#?}"
    );
    let init = &entries[1]["params"];
    assert_eq!(init["protocolVersion"], "2025-11-25");
    assert_eq!(init["clientInfo"]["name"], "oncely-inventory");
    let reply = &entries
        .iter()
        .find(|e| e["event"] == "reply")
        .expect("the roots/list request answered")["reply"];
    assert_eq!(reply["id"], "srv-1");
    assert_eq!(reply["error"]["code"], -32601);
    assert_eq!(
        entries
            .iter()
            .filter(|e| e["method"] == "tools/list")
            .map(|e| e["params"]["cursor"].clone())
            .collect::<Vec<_>>(),
        [Value::Null, Value::from("p2")]
    );
    assert_eq!(entries.last().unwrap()["event"], "eof");
    let pid = entries[0]["pid"].as_u64().unwrap();
    assert!(!alive(pid), "the server still runs");

    // The starting config shows the command line that guards the server, in comments
    // (check-config passes).
    assert_checks(&written);
    let text = std::fs::read_to_string(&written).unwrap();
    assert!(!text.lines().any(|l| l.starts_with("[[mcp]]")), "{text}");
    assert!(
        text.contains(&format!(
            "\n#   oncely mcp --action send_invoice --action wipe -- {command}\n"
        )),
        "{text}"
    );
}

#[test]
fn a_stdio_server_that_does_not_exit_when_its_input_ends_is_killed() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("server.py");
    std::fs::write(&script, SCRIPTED).unwrap();
    let log = dir.path().join("log");
    let command = format!(
        "{} {} {} stubborn",
        sh(python.to_str().unwrap()),
        sh(script.to_str().unwrap()),
        sh(log.to_str().unwrap())
    );
    let started = std::time::Instant::now();
    let inv = inventory(&["--mcp-command", &command]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(inv["operations"].as_array().unwrap().len(), 4);
    let entries = log_entries(&log);
    assert_eq!(entries.last().unwrap()["event"], "eof");
    let pid = entries[0]["pid"].as_u64().unwrap();
    assert!(!alive(pid), "the server still runs");
}

#[test]
fn stdio_and_http_servers_in_one_inventory_and_one_starting_config() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let shop = Shop::start(&python, true);
    let dir = tempfile::tempdir().unwrap();
    let command = stdio_server(&python, &dir.path().join("server.log"));
    let written = dir.path().join("oncely.toml");
    let inv = inventory(&[
        "--mcp",
        &shop.url,
        "--mcp-command",
        &command,
        "--write-config",
        written.to_str().unwrap(),
    ]);
    let ops = inv["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 4 + 3, "{inv:#}");
    for o in ops {
        let (source, transport) = if o["source"] == shop.url.as_str() {
            (&shop.url, "http")
        } else {
            (&command, "stdio")
        };
        assert_eq!(o["source"], source.as_str());
        assert_eq!(o["transport"], transport, "{o:#}");
    }
    assert_checks(&written);
    let text = std::fs::read_to_string(&written).unwrap();
    assert_eq!(
        text.lines().filter(|l| l.starts_with("[[mcp]]")).count(),
        1,
        "{text}"
    );
    assert!(
        text.contains(&format!("upstream = \"{}\"", shop.url)),
        "{text}"
    );
    assert!(
        text.contains(&format!("\n#   oncely mcp -- {command}\n")),
        "{text}"
    );

    // With that config the HTTP server is guarded; the stdio server is not (no [[mcp]]
    // is about it), whatever its `upstream`.
    let inv = inventory(&[
        "--mcp",
        &shop.url,
        "--mcp-command",
        &command,
        "--config",
        written.to_str().unwrap(),
    ]);
    for o in inv["operations"].as_array().unwrap() {
        if o["transport"] == "http" {
            assert_eq!(o["configured"], true, "{o:#}");
            assert_eq!(gap_kinds(o), Vec::<&str>::new(), "{o:#}");
        } else {
            assert_eq!(o["configured"], false, "{o:#}");
            let expected: &[&str] = if o["class"] == "read" {
                &[]
            } else {
                &["unguarded"]
            };
            assert_eq!(gap_kinds(o), expected, "{o:#}");
        }
    }
}

#[test]
fn stdio_commands_that_cannot_start_or_split_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-server");
    let command = format!("{} --flag", missing.display());
    let o = run(&["inventory", "--mcp-command", &command]);
    assert_usage_error(
        &o,
        &format!(
            "--mcp-command '{command}': cannot start {}: ",
            missing.display()
        ),
    );

    for (command, error) in [
        ("python3 'server.py", "unterminated single quote"),
        ("python3 \"server.py", "unterminated double quote"),
        ("   ", "no command"),
    ] {
        let o = run(&["inventory", "--mcp-command", command]);
        assert_usage_error(&o, &format!("--mcp-command '{command}': {error}"));
    }
    // A bad command line stops everything before anything starts.
    let log = dir.path().join("log");
    let o = run(&[
        "inventory",
        "--mcp-command",
        &format!("sh -c 'echo started > {}'", log.display()),
        "--mcp-command",
        "x 'y",
    ]);
    assert_usage_error(&o, "unterminated single quote");
    assert!(!log.exists());

    // A server that exits at once.
    let o = run(&["inventory", "--mcp-command", "sh -c 'exit 3'"]);
    assert_usage_error(&o, "exit status: 3");
}

/// A server the host already starts through `oncely mcp`: its tools are listed through
/// the wrapper (the inventory runs the line as the host would) and reported as that
/// line guards them, with no fix that would wrap it twice.
#[test]
fn a_stdio_server_wrapped_by_oncely_mcp_is_reported_as_guarded() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = stdio_server(&python, &dir.path().join("server.log"));
    let command = format!(
        "{} mcp --store {} --action render --window 1h -- {server}",
        sh(env!("CARGO_BIN_EXE_oncely")),
        sh(&format!("sqlite://{}", dir.path().join("mcp.db").display())),
    );
    let inv = inventory(&["--mcp-command", &command]);
    let render = op(&inv, "render");
    assert_eq!(render["class"], "action", "{inv:#}");
    assert_eq!(render["configured"], true);
    assert_eq!(render["key"], "fingerprint");
    assert_eq!(render["window"], "1h", "{render:#}");
    assert_eq!(gap_kinds(render), Vec::<&str>::new(), "{render:#}");
    let ask = op(&inv, "ask");
    assert_eq!(ask["class"], "write");
    assert_eq!(gap_kinds(ask), Vec::<&str>::new(), "{ask:#}");
    let lookup = op(&inv, "lookup");
    assert_eq!(lookup["class"], "read");
    assert_eq!(lookup["key"], Value::Null);
    // Only the guarded tools named by --tool are guarded.
    let only = command.replace(" --action render", " --tool ask");
    let inv = inventory(&["--mcp-command", &only]);
    assert_eq!(gap_kinds(op(&inv, "ask")), Vec::<&str>::new());
    let render = op(&inv, "render");
    assert_eq!(gap_kinds(render), ["unguarded"]);
    let fix = gap(render, "unguarded")["fix"].as_str().unwrap();
    assert!(fix.starts_with("add `--tool render`"), "{fix}");
    assert!(!fix.contains("oncely mcp --"), "never wrapped twice: {fix}");
}

// Key arguments and keys asked for anew with every request (`data/listed_tools_server.py`
// lists the tools each test writes; `data/payments-openapi.yaml`).

/// The command line of `data/listed_tools_server.py` listing `tools` (written to `dir`).
fn listed_tools(python: &Path, dir: &Path, tools: Value) -> String {
    let file = dir.join("tools.json");
    std::fs::write(&file, tools.to_string()).unwrap();
    format!(
        "{} {} {}",
        sh(python.to_str().unwrap()),
        sh(&data("listed_tools_server.py")),
        sh(file.to_str().unwrap())
    )
}

/// `command` as an `oncely mcp` line guards it (its ledger in `dir`), with `options`.
fn wrapped(dir: &Path, options: &str, command: &str) -> String {
    format!(
        "{} mcp --store {} {options} -- {command}",
        sh(env!("CARGO_BIN_EXE_oncely")),
        sh(&format!("sqlite://{}", dir.join("mcp.db").display())),
    )
}

/// The table `oncely inventory ARGS` prints.
fn table(args: &[&str]) -> String {
    let mut all = vec!["inventory"];
    all.extend_from_slice(args);
    let o = run(&all);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
}

const KEYS_HEADING: &str =
    "\nkey arguments (left out of the call's key; what the server gets in them):\n";

#[test]
fn an_idempotency_key_argument_is_named_and_replaced_with_a_derived_uuid() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let command = listed_tools(
        &python,
        dir.path(),
        serde_json::json!([
            {"name": "create_payment", "description": "Creates a payment.",
             "inputSchema": {"type": "object", "properties": {
                "amount": {"type": "integer"},
                "idempotency_key": {"type": "string"}}}},
            {"name": "add_note",
             "inputSchema": {"type": "object", "properties": {"note": {"type": "string"}}}},
        ]),
    );
    let inv = inventory(&["--mcp-command", &command]);
    let pay = op(&inv, "create_payment");
    assert_eq!(
        pay["key_arguments"],
        serde_json::json!([{
            "argument": "/idempotency_key",
            "replaced": true,
            "what": "replaced with a derived UUID, once oncely guards the tool",
        }]),
        "{pay:#}"
    );
    assert_eq!(gap_kinds(pay), ["unguarded"]);
    assert_eq!(op(&inv, "add_note")["key_arguments"], serde_json::json!([]));

    // Guarded by an `oncely mcp` line: the server gets the derived key.
    let guarded = wrapped(dir.path(), "--action create_payment", &command);
    let inv = inventory(&["--mcp-command", &guarded]);
    let pay = op(&inv, "create_payment");
    assert_eq!(pay["configured"], true, "{pay:#}");
    assert_eq!(
        pay["key_arguments"][0]["what"],
        "replaced with a derived UUID"
    );
    assert_eq!(gap_kinds(pay), Vec::<&str>::new());
    let text = table(&["--mcp-command", &guarded]);
    assert!(
        text.contains(&format!(
            "{KEYS_HEADING}  tool create_payment /idempotency_key: replaced with a derived UUID\n"
        )),
        "{text}"
    );
    assert!(!text.contains("add_note /"), "{text}");
}

#[test]
fn a_key_argument_whose_schema_has_max_length_16_is_forwarded_as_sent() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let command = listed_tools(
        &python,
        dir.path(),
        serde_json::json!([{"name": "start_instance", "description": "Starts an instance.",
            "inputSchema": {"type": "object", "properties": {
                "image": {"type": "string"},
                "ClientToken": {"type": "string", "maxLength": 16}}}}]),
    );
    let forwarded = "forwarded as sent (the schema's maxLength 16 rules the UUID out)";
    let inv = inventory(&["--mcp-command", &command]);
    assert_eq!(
        op(&inv, "start_instance")["key_arguments"],
        serde_json::json!([{
            "argument": "/ClientToken",
            "replaced": false,
            "what": format!("{forwarded}, once oncely guards the tool"),
        }])
    );
    let text = table(&["--mcp-command", &wrapped(dir.path(), "", &command)]);
    assert!(
        text.contains(&format!(
            "{KEYS_HEADING}  tool start_instance /ClientToken: {forwarded}\n"
        )),
        "{text}"
    );
}

/// Square's payment tool, as its MCP server describes its key.
const SQUARE_KEY: &str = "A unique string that identifies this CreatePayment request. Keys \
    can be any valid string but must be unique for every CreatePayment request. Note: The \
    number of allowed characters might be less than the stated maximum, if multi-byte \
    characters are used.";

#[test]
fn a_description_asking_for_a_unique_key_on_every_request_is_a_gap() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let command = listed_tools(
        &python,
        dir.path(),
        serde_json::json!([{"name": "make_payment", "description": "Takes a payment.",
            "inputSchema": {"type": "object", "properties": {
                "amount": {"type": "integer"},
                "idempotency_key": {"type": "string", "description": SQUARE_KEY}}}}]),
    );
    let why = "the description of /idempotency_key tells the model to send a new or unique \
        key with every request (\"Keys can be any valid string but must be unique for every \
        CreatePayment request\"): a model told this makes up a new key on every retry, so the \
        server's own idempotency sees a new key each time and runs the call again. oncely \
        keeps the call one intention";
    let inv = inventory(&["--mcp-command", &command]);
    let pay = op(&inv, "make_payment");
    assert_eq!(
        gap_kinds(pay),
        ["unguarded", "new_key_per_request"],
        "{pay:#}"
    );
    let g = gap(pay, "new_key_per_request");
    assert_eq!(
        g["detail"],
        format!(
            "{why} once it guards the tool: /idempotency_key is left out of the call's key, \
             and the server gets in it a key derived from the record, the same on every attempt"
        )
    );
    assert_eq!(
        g["fix"],
        "# guard the tool (the lines of its `unguarded` gap): nothing more is needed"
    );

    // Guarded, it says so, and the table lists it with the other gaps.
    let guarded = wrapped(dir.path(), "--action make_payment", &command);
    let inv = inventory(&["--mcp-command", &guarded]);
    let pay = op(&inv, "make_payment");
    assert_eq!(gap_kinds(pay), ["new_key_per_request"], "{pay:#}");
    let g = gap(pay, "new_key_per_request");
    assert!(
        g["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{why}: /idempotency_key is left out")),
        "{g:#}"
    );
    assert_eq!(
        g["fix"],
        "# nothing to add: keep the tool guarded and /idempotency_key a key argument \
         (no `key_arguments = []`)"
    );
    let text = table(&["--mcp-command", &guarded]);
    assert!(
        text.contains("1 gap(s)")
            && text.contains(&format!(
                "\n- tool make_payment (new_key_per_request): {why}:"
            )),
        "{text}"
    );
}

#[test]
fn an_openapi_idempotency_key_header_unique_for_each_request_is_a_gap() {
    let doc = data("payments-openapi.yaml");
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("oncely.toml");
    let inv = inventory(&[
        "--openapi",
        &doc,
        "--write-config",
        written.to_str().unwrap(),
    ]);
    let pay = op(&inv, "POST /payments");
    assert_eq!(
        gap_kinds(pay),
        ["unguarded", "no_reconcile", "new_key_per_request"],
        "{pay:#}"
    );
    let why = "the description of its Idempotency-Key header tells the caller to send a new \
        or unique key with every request (\"A key unique for each request, e.g. a UUID v4\"): \
        a caller told this makes up a new key on every retry, so the server's own idempotency \
        sees a new key each time and runs the call again; ";
    let g = gap(pay, "new_key_per_request");
    assert_eq!(
        g["detail"],
        format!(
            "{why}a route keyed by that header (the default, header-or-fingerprint, uses it \
             when it is sent) takes each attempt for a new call"
        )
    );
    let keyed = "the call is keyed by its request, and the upstream gets in Idempotency-Key a \
        key derived from the record, the same on every attempt";
    assert_eq!(
        g["fix"],
        format!("key = \"fingerprint\"  # in the [[routes]] of POST /payments: {keyed}")
    );

    // The starting config keys it by its request; with it, nothing is left to add.
    assert_checks(&written);
    let config = std::fs::read_to_string(&written).unwrap();
    assert!(
        config.contains("path = \"/payments\"\nclass = \"action\"\nkey = \"fingerprint\"\n"),
        "{config}"
    );
    let inv = inventory(&["--openapi", &doc, "--config", written.to_str().unwrap()]);
    let pay = op(&inv, "POST /payments");
    assert_eq!(pay["key"], "fingerprint");
    let g = gap(pay, "new_key_per_request");
    assert!(
        g["detail"]
            .as_str()
            .unwrap()
            .ends_with("; oncely keeps the call one intention: the route keys it by its request, not by the header, and sends the upstream a key derived from the record in Idempotency-Key, the same on every attempt"),
        "{g:#}"
    );
    assert!(
        g["fix"]
            .as_str()
            .unwrap()
            .starts_with("# nothing to add: keep key = \"fingerprint\"  # (in the route "),
        "{g:#}"
    );
}

#[test]
fn a_description_that_says_to_reuse_the_key_on_retries_is_no_gap() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let command = listed_tools(
        &python,
        dir.path(),
        serde_json::json!([{"name": "refund_payment",
            "description": "Refunds a payment. Send a new idempotency_key for each new refund, \
                and the same key again when you retry a request.",
            "inputSchema": {"type": "object", "properties": {
                "idempotency_key": {"type": "string",
                    "description": "Reuse it on retries: a different key for every attempt \
                        makes another refund."}}}}]),
    );
    let guarded = wrapped(dir.path(), "--action refund_payment", &command);
    let inv = inventory(&[
        "--mcp-command",
        &guarded,
        "--openapi",
        &data("payments-openapi.yaml"),
    ]);
    let refund = op(&inv, "refund_payment");
    assert_eq!(gap_kinds(refund), Vec::<&str>::new(), "{refund:#}");
    assert_eq!(refund["key_arguments"][0]["argument"], "/idempotency_key");
    // The OpenAPI operation whose description says to send the same key on a retry.
    assert_eq!(
        gap_kinds(op(&inv, "POST /refunds")),
        ["unguarded", "no_reconcile"]
    );
}

#[test]
fn configured_key_arguments_are_honoured_and_an_unnamed_key_gets_the_line_that_names_it() {
    let Some(python) = crate::mcp::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let command = listed_tools(
        &python,
        dir.path(),
        serde_json::json!([{"name": "charge",
            "description": "Charges a card. Generate a new UUID for each request and pass it as nonce.",
            "inputSchema": {"type": "object", "properties": {
                "card": {"type": "string"},
                "nonce": {"type": "string"},
                "request_id": {"type": "string"}}}}]),
    );
    // By default request_id is a key argument, nonce is not: the gap says how to name it.
    let plain = wrapped(dir.path(), "--action charge", &command);
    let inv = inventory(&["--mcp-command", &plain]);
    let charge = op(&inv, "charge");
    let pointers = |o: &Value| -> Vec<String> {
        o["key_arguments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["argument"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(pointers(charge), ["/request_id"]);
    let g = gap(charge, "new_key_per_request");
    assert!(
        g["detail"].as_str().unwrap().starts_with(
            "the tool's description tells the model to send a new or unique key with every \
             request (\"Generate a new UUID for each request and pass it as nonce\")"
        ),
        "{g:#}"
    );
    let fix = "--key-argument charge:/nonce  # on the `oncely mcp` line, before its `--` \
        (or in key_arguments of [mcp_stdio])";
    assert!(
        g["detail"].as_str().unwrap().ends_with(
            ". oncely keeps such a call one intention by leaving its key arguments out of the \
             call's key and sending a key derived from the record in them, but /nonce is not one"
        ),
        "{g:#}"
    );
    assert_eq!(g["fix"], fix);

    // A --key-argument on the line names nonce; [mcp_stdio] key_arguments = [] turns the
    // default off.
    let named = wrapped(
        dir.path(),
        "--action charge --key-argument charge:/nonce",
        &command,
    );
    let inv = inventory(&["--mcp-command", &named]);
    let charge = op(&inv, "charge");
    assert_eq!(pointers(charge), ["/request_id", "/nonce"]);
    assert_eq!(
        gap(charge, "new_key_per_request")["fix"],
        "# nothing to add: keep the tool guarded and /nonce a key argument (no \
         `key_arguments = []`)"
    );
    let config = dir.path().join("oncely.toml");
    std::fs::write(&config, "[mcp_stdio]\nkey_arguments = []\n").unwrap();
    assert_checks(&config);
    let inv = inventory(&[
        "--mcp-command",
        &plain,
        "--config",
        config.to_str().unwrap(),
    ]);
    let charge = op(&inv, "charge");
    assert_eq!(pointers(charge), Vec::<String>::new());
    assert_eq!(gap(charge, "new_key_per_request")["fix"], fix);
}
