//! The process interface through the real binary: `oncely --version`, and `SIGHUP`
//! (sent with `kill -HUP`) reading the config file again: routes, `[[mcp]]` and
//! `[[webhooks]]` change for new requests, requests in flight finish on the config they
//! started with, a config with problems is refused (each logged) and the old one kept.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use oncely_webhooks::{sign, Scheme, Secrets};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::common::{get, oncely, post as http_post, run, stdout, upstream, Answer, Gateway};

#[test]
fn version_prints_oncely_and_the_crate_version() {
    let o = oncely().arg("--version").output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(o.stdout).unwrap(),
        format!("oncely {}\n", env!("CARGO_PKG_VERSION"))
    );
    assert!(o.stderr.is_empty());
}

/// What the upstream executed: per path and client key, the number of calls. `/v1/slow` waits
/// for a permit of `gate` before answering.
#[derive(Clone)]
struct Upstream {
    calls: Arc<Mutex<HashMap<String, usize>>>,
    gate: Arc<Semaphore>,
    slow_started: Arc<AtomicUsize>,
}

impl Upstream {
    fn calls(&self, path: &str, key: &str) -> usize {
        let calls = self.calls.lock().unwrap();
        calls.get(&format!("{path} {key}")).copied().unwrap_or(0)
    }
}

async fn counting_upstream() -> (String, Upstream) {
    let up = Upstream {
        calls: Arc::default(),
        gate: Arc::new(Semaphore::new(0)),
        slow_started: Arc::default(),
    };
    let u = up.clone();
    let app = Router::new().route(
        "/{*path}",
        post(move |uri: http::Uri, body: String| {
            let u = u.clone();
            async move {
                // The key comes as the body's "order" (the Idempotency-Key sent upstream
                // is the downstream key oncely derives).
                let key = serde_json::from_str::<Value>(&body).unwrap()["order"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                let n = {
                    let mut calls = u.calls.lock().unwrap();
                    let n = calls.entry(format!("{} {key}", uri.path())).or_default();
                    *n += 1;
                    *n
                };
                if uri.path() == "/v1/slow" {
                    u.slow_started.fetch_add(1, Ordering::SeqCst);
                    u.gate.acquire().await.unwrap().forget();
                } else if uri.path() == "/v1/busy" {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                let reply = json!({"path": uri.path(), "call": n, "body": body});
                (StatusCode::CREATED, reply.to_string())
            }
        }),
    );
    let addr = upstream(app).await;
    (format!("http://{addr}"), up)
}

/// A config with the default upstream and one guarded `POST` route per path.
fn config_text(dir: &Path, upstream: &str, paths: &[&str], extra: &str) -> String {
    let mut text = format!(
        "store = \"sqlite://{}\"\nupstream = \"{upstream}\"\n{extra}\n",
        dir.join("ledger.db").display()
    );
    for path in paths {
        text.push_str(&format!(
            "\n[[routes]]\nmethod = \"POST\"\npath = \"{path}\"\nclass = \"write\"\n\
             key = \"header\"\nprincipal = \"header:authorization\"\nwait = \"20s\"\n\
             lease = \"5s\"\n"
        ));
    }
    text
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

fn reload_lines(gw: &Gateway) -> Vec<String> {
    gw.lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("config reloaded") || l.contains("config reload refused"))
        .cloned()
        .collect()
}

/// Sends SIGHUP and waits for the reload's log line, which it returns.
async fn hup(gw: &Gateway) -> String {
    let before = reload_lines(gw).len();
    let status = Command::new("kill")
        .args(["-HUP", &gw.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    for _ in 0..400 {
        let lines = reload_lines(gw);
        if lines.len() > before {
            return lines[before].clone();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "no reload line after SIGHUP:\n{}",
        gw.lines.lock().unwrap().join("\n")
    );
}

async fn call(gw: &Gateway, path: &str, key: &str) -> Answer {
    http_post(
        &gw.url(path),
        &format!("{{\"order\":\"{key}\"}}"),
        &[
            ("authorization", "Bearer sk_alice"),
            ("content-type", "application/json"),
            ("idempotency-key", key),
        ],
    )
    .await
}

fn oncely_status(a: &Answer) -> Option<&str> {
    a.headers.get("oncely-status").map(|v| v.to_str().unwrap())
}

fn start(config: &Path) -> Gateway {
    Gateway::start(&["--config", config.to_str().unwrap()], &[])
}

async fn reloads_metric(gw: &Gateway, result: &str) -> u64 {
    let m = get(&gw.admin_url("/metrics"), &[]).await;
    let needle = format!("oncely_config_reloads_total{{result=\"{result}\"}} ");
    m.text()
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_added_by_a_reload_is_guarded_and_a_removed_one_is_not() {
    let (up, seen) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    write(&cfg, &config_text(dir.path(), &up, &["/v1/a"], ""));
    let gw = start(&cfg);

    // Before: /v1/a is guarded, /v1/b is only forwarded.
    for _ in 0..2 {
        assert_eq!(call(&gw, "/v1/a", "a1").await.status, StatusCode::CREATED);
        assert_eq!(call(&gw, "/v1/b", "b1").await.status, StatusCode::CREATED);
    }
    assert_eq!(seen.calls("/v1/a", "a1"), 1);
    assert_eq!(seen.calls("/v1/b", "b1"), 2);

    write(&cfg, &config_text(dir.path(), &up, &["/v1/b"], ""));
    let line = hup(&gw).await;
    assert!(line.contains("config reloaded"), "{line}");

    let first = call(&gw, "/v1/b", "b2").await;
    let again = call(&gw, "/v1/b", "b2").await;
    assert_eq!(oncely_status(&first), Some("fresh"));
    assert_eq!(oncely_status(&again), Some("replayed"));
    assert_eq!(again.body, first.body);
    assert_eq!(seen.calls("/v1/b", "b2"), 1, "the new route is guarded");
    for _ in 0..2 {
        let a = call(&gw, "/v1/a", "a2").await;
        assert_eq!(a.status, StatusCode::CREATED);
        assert_eq!(oncely_status(&a), None);
    }
    assert_eq!(
        seen.calls("/v1/a", "a2"),
        2,
        "the removed route is not guarded"
    );
    assert_eq!(reloads_metric(&gw, "ok").await, 1);
    assert_eq!(reloads_metric(&gw, "refused").await, 0);
    assert_eq!(gw.terminate().code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_during_a_reload_completes_and_is_replayed_after_it() {
    let (up, seen) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    write(&cfg, &config_text(dir.path(), &up, &["/v1/slow"], ""));
    let gw = Arc::new(start(&cfg));

    let in_flight = {
        let gw = gw.clone();
        tokio::spawn(async move { call(&gw, "/v1/slow", "s1").await })
    };
    while seen.slow_started.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The reload removes the slow route (and adds another): the call in flight keeps
    // the config it started with.
    write(&cfg, &config_text(dir.path(), &up, &["/v1/other"], ""));
    assert!(hup(&gw).await.contains("config reloaded"));
    seen.gate.add_permits(1);
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(oncely_status(&answer), Some("fresh"));
    let id = answer.header("oncely-record").to_owned();

    // Its record completed; once the route is back, a retry is a replay.
    let db = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let show = run(&["ledger", "show", &id, "--json", "--store", &db]);
    let record: Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(record["state"], "completed", "{record}");
    write(
        &cfg,
        &config_text(dir.path(), &up, &["/v1/slow", "/v1/other"], ""),
    );
    assert!(hup(&gw).await.contains("config reloaded"));
    let retry = call(&gw, "/v1/slow", "s1").await;
    assert_eq!(oncely_status(&retry), Some("replayed"));
    assert_eq!(retry.body, answer.body);
    assert_eq!(seen.calls("/v1/slow", "s1"), 1);
    let gw = Arc::into_inner(gw).unwrap();
    assert_eq!(gw.terminate().code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_with_problems_is_refused_logged_and_the_old_one_kept() {
    let (up, seen) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    write(&cfg, &config_text(dir.path(), &up, &["/v1/a"], ""));
    let gw = start(&cfg);
    assert_eq!(oncely_status(&call(&gw, "/v1/a", "k").await), Some("fresh"));

    // A syntax error.
    write(&cfg, "[[routes]\nmethod = ");
    let line = hup(&gw).await;
    assert!(line.contains("config reload refused"), "{line}");
    // Two validation errors: each is logged.
    let bad = config_text(dir.path(), &up, &["/v1/b"], "")
        .replace("class = \"write\"", "class = \"bogus\"")
        .replace("wait = \"20s\"", "wait = \"soon\"");
    write(&cfg, &bad);
    assert!(hup(&gw).await.contains("config reload refused"));
    // A field only a restart can change.
    let moved = config_text(dir.path(), &up, &["/v1/b"], "").replace("ledger.db", "other.db");
    write(&cfg, &moved);
    assert!(hup(&gw).await.contains("config reload refused"));
    let lines = gw.lines.lock().unwrap().join("\n");
    let problems: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("config reload: problem"))
        .collect();
    assert!(
        problems.iter().any(|l| l.contains("TOML syntax")),
        "{lines}"
    );
    assert!(problems.iter().any(|l| l.contains("bogus")), "{lines}");
    assert!(problems.iter().any(|l| l.contains("soon")), "{lines}");
    assert!(
        problems
            .iter()
            .any(|l| l.contains("store: changed, and only a restart can change it")),
        "{lines}"
    );

    // The old routes still work: /v1/a guarded (a replay), /v1/b not.
    let again = call(&gw, "/v1/a", "k").await;
    assert_eq!(oncely_status(&again), Some("replayed"));
    assert_eq!(seen.calls("/v1/a", "k"), 1);
    assert_eq!(oncely_status(&call(&gw, "/v1/b", "k").await), None);
    assert_eq!(reloads_metric(&gw, "refused").await, 3);
    assert_eq!(reloads_metric(&gw, "ok").await, 0);
    assert!(!dir.path().join("other.db").exists());
    assert_eq!(gw.terminate().code(), Some(0));
}

fn job_route(path: &str) -> String {
    format!(
        "\n[[routes]]\nmethod = \"POST\"\npath = \"{path}\"\nclass = \"job\"\nkey = \"header\"\n\
         principal = \"header:authorization\"\nwait = \"10s\"\nlease = \"2s\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_routes_change_on_reload_and_a_first_one_needs_a_restart() {
    let (up, seen) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    let base = config_text(dir.path(), &up, &["/v1/a"], "");
    write(&cfg, &base);
    let gw = start(&cfg);
    // Started without a job route (so without a job key): a first one is refused.
    write(&cfg, &format!("{base}{}", job_route("/v1/job1")));
    assert!(hup(&gw).await.contains("config reload refused"));
    assert!(gw
        .lines
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("a first `job` route needs a restart")));
    assert_eq!(gw.terminate().code(), Some(0));

    // Started with one: a reload adds another, and the job worker runs its jobs.
    let gw = start(&cfg);
    let a = call(&gw, "/v1/job1", "j1").await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    assert_eq!(oncely_status(&a), Some("fresh"));
    write(
        &cfg,
        &format!("{base}{}{}", job_route("/v1/job1"), job_route("/v1/job2")),
    );
    assert!(hup(&gw).await.contains("config reloaded"));
    let b = call(&gw, "/v1/job2", "j2").await;
    assert_eq!(b.status, StatusCode::CREATED, "{}", b.text());
    assert_eq!(oncely_status(&b), Some("fresh"));
    let again = call(&gw, "/v1/job2", "j2").await;
    assert_eq!(oncely_status(&again), Some("replayed"));
    assert_eq!(seen.calls("/v1/job2", "j2"), 1);
    // The first route's jobs still run.
    let c = call(&gw, "/v1/job1", "j3").await;
    assert_eq!(oncely_status(&c), Some("fresh"));
    assert_eq!(seen.calls("/v1/job1", "j3"), 1);
    assert_eq!(gw.terminate().code(), Some(0));
}

/// A minimal MCP server: answers JSON-RPC with JSON, counting `tools/call`s; a call whose
/// `text` is `slow` waits for a permit of the gate.
#[derive(Clone)]
struct McpServer {
    calls: Arc<AtomicUsize>,
    methods: Arc<Mutex<Vec<String>>>,
    gate: Arc<Semaphore>,
}

async fn mcp_upstream() -> (String, Arc<AtomicUsize>) {
    let (url, server) = mcp_server().await;
    (url, server.calls)
}

async fn mcp_server() -> (String, McpServer) {
    let server = McpServer {
        calls: Arc::default(),
        methods: Arc::default(),
        gate: Arc::new(Semaphore::new(0)),
    };
    let c = server.clone();
    let app = Router::new().route(
        "/mcp",
        post(move |body: String| {
            let c = c.clone();
            async move {
                let msg: Value = serde_json::from_str(&body).unwrap();
                c.methods
                    .lock()
                    .unwrap()
                    .push(msg["method"].as_str().unwrap_or("").to_owned());
                if msg["params"]["arguments"]["text"] == "slow" {
                    c.gate.acquire().await.unwrap().forget();
                }
                let result = if msg["method"] == "tools/call" {
                    let n = c.calls.fetch_add(1, Ordering::SeqCst) + 1;
                    json!({"content": [{"type": "text", "text": format!("render #{n}")}]})
                } else {
                    json!({})
                };
                (
                    [("content-type", "application/json")],
                    json!({"jsonrpc": "2.0", "id": msg["id"], "result": result}).to_string(),
                )
            }
        }),
    );
    let addr = upstream(app).await;
    (format!("http://{addr}/mcp"), server)
}

async fn tools_call(gw: &Gateway, id: i64) -> Answer {
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "render", "arguments": {"text": "chapter one"}}});
    mcp_post(gw, msg).await
}

async fn mcp_post(gw: &Gateway, msg: Value) -> Answer {
    http_post(
        &gw.url("/mcp"),
        &msg.to_string(),
        &[
            ("authorization", "Bearer sk_alice"),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-11-25"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_entries_change_on_reload() {
    let (mcp, calls) = mcp_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    // Without an [[mcp]] entry, /mcp is forwarded to the default upstream (the MCP
    // server's host) like any path: every call executes.
    let upstream_base = mcp.trim_end_matches("/mcp").to_owned();
    write(&cfg, &config_text(dir.path(), &upstream_base, &[], ""));
    let gw = start(&cfg);
    tools_call(&gw, 1).await;
    tools_call(&gw, 2).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let entry = format!(
        "[[mcp]]\npath = \"/mcp\"\nupstream = \"{mcp}\"\nprincipal = \"header:authorization\"\n\
         tools = [\"*\"]\nwindow = \"1h\"\n"
    );
    write(&cfg, &config_text(dir.path(), &upstream_base, &[], &entry));
    assert!(hup(&gw).await.contains("config reloaded"));
    let first = tools_call(&gw, 3).await;
    let again = tools_call(&gw, 4).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_eq!(
        again.json()["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed",
        "{}",
        again.text()
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the new entry guards tools/call"
    );

    // An entry that cannot be resolved (its JWT secret is unset) is refused whole.
    let broken = entry.replace(
        "principal = \"header:authorization\"",
        "principal = \"jwt:sub\"\njwt_secret_env = \"ONCELY_TEST_UNSET_SECRET\"",
    );
    write(&cfg, &config_text(dir.path(), &upstream_base, &[], &broken));
    let line = hup(&gw).await;
    assert!(line.contains("config reload refused"), "{line}");
    let still = tools_call(&gw, 5).await;
    assert_eq!(
        still.json()["result"]["_meta"]["dev.oncely/replay"]["status"],
        "replayed"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // Removed: forwarded again, unguarded.
    write(&cfg, &config_text(dir.path(), &upstream_base, &[], ""));
    assert!(hup(&gw).await.contains("config reloaded"));
    tools_call(&gw, 6).await;
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(gw.terminate().code(), Some(0));
}

/// The cancellation of a guarded call in flight is dropped (never forwarded) by the
/// endpoint that runs it: a reload that leaves the entry as it was keeps that endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_in_flight_keeps_its_endpoint_across_a_reload() {
    let (mcp, server) = mcp_server().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    let entry = format!(
        "[[mcp]]\npath = \"/mcp\"\nupstream = \"{mcp}\"\nprincipal = \"header:authorization\"\n\
         tools = [\"*\"]\nwindow = \"1h\"\n"
    );
    let base = mcp.trim_end_matches("/mcp").to_owned();
    write(&cfg, &config_text(dir.path(), &base, &[], &entry));
    let gw = Arc::new(start(&cfg));
    let in_flight = {
        let gw = gw.clone();
        tokio::spawn(async move {
            let msg = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "render", "arguments": {"text": "slow"}}});
            mcp_post(&gw, msg).await
        })
    };
    eventually("the call reached the MCP server", || {
        server
            .methods
            .lock()
            .unwrap()
            .iter()
            .any(|m| m == "tools/call")
    })
    .await;
    // A reload that changes something else: the entry keeps its endpoint.
    write(
        &cfg,
        &config_text(dir.path(), &base, &["/v1/other"], &entry),
    );
    assert!(hup(&gw).await.contains("config reloaded"));
    let cancel = mcp_post(
        &gw,
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 7, "reason": "client timeout"}}),
    )
    .await;
    assert_eq!(cancel.status, StatusCode::ACCEPTED, "{}", cancel.text());
    server.gate.add_permits(1);
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert!(answer.text().contains("render #1"), "{}", answer.text());
    let methods = server.methods.lock().unwrap().clone();
    assert!(
        !methods.iter().any(|m| m == "notifications/cancelled"),
        "the cancellation of the guarded call was forwarded: {methods:?}"
    );
    let gw = Arc::into_inner(gw).unwrap();
    assert_eq!(gw.terminate().code(), Some(0));
}

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A webhook handler: the bodies it received, failing while `fail` is set.
#[derive(Clone, Default)]
struct Handler {
    bodies: Arc<Mutex<Vec<String>>>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

async fn handle(State(h): State<Handler>, body: String) -> StatusCode {
    h.bodies.lock().unwrap().push(body);
    if h.fail.load(Ordering::SeqCst) {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}

async fn handler() -> (Handler, std::net::SocketAddr) {
    let h = Handler::default();
    let addr = upstream(
        Router::new()
            .route("/internal/events", post(handle))
            .with_state(h.clone()),
    )
    .await;
    (h, addr)
}

fn hook_config(dir: &Path, deliver_to: Option<std::net::SocketAddr>) -> String {
    let mut text = format!(
        "store = \"sqlite://{}\"\nupstream = \"http://127.0.0.1:9\"\n",
        dir.join("ledger.db").display()
    );
    if let Some(to) = deliver_to {
        text.push_str(&format!(
            "\n[[webhooks]]\npath = \"/hooks/events\"\nverify = \"standard\"\n\
             secret_env = \"TEST_WEBHOOK_SECRET\"\ntolerance = \"5m\"\n\
             deliver_to = \"http://{to}/internal/events\"\ndeliver_timeout = \"2s\"\n\
             max_attempts = 40\nretry_backoff = \"50ms\"\nlease = \"2s\"\n"
        ));
    }
    text
}

async fn event(gw: &Gateway, id: &str) -> Answer {
    let body = format!(r#"{{"type":"invoice.paid","id":"{id}"}}"#);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let scheme: Scheme = "standard".parse().unwrap();
    let secrets = Secrets::parse(&scheme, SECRET).unwrap();
    let mut headers = sign(&scheme, secrets.primary(), id, now, body.as_bytes());
    headers.push(("content-type".into(), "application/json".into()));
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    http_post(&gw.url("/hooks/events"), &body, &h).await
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    for _ in 0..400 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting until {what}");
}

fn got(h: &Handler, id: &str) -> usize {
    h.bodies
        .lock()
        .unwrap()
        .iter()
        .filter(|b| b.contains(&format!("\"{id}\"")))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_entries_change_on_reload_and_queued_deliveries_are_kept() {
    let (old, old_addr) = handler().await;
    let (new, new_addr) = handler().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    // Started without webhooks: the first entry comes with a reload.
    write(&cfg, &hook_config(dir.path(), None));
    let gw = Gateway::start(
        &["--config", cfg.to_str().unwrap()],
        &[("TEST_WEBHOOK_SECRET", SECRET)],
    );
    assert_ne!(event(&gw, "evt_0").await.status, StatusCode::OK);

    write(&cfg, &hook_config(dir.path(), Some(old_addr)));
    assert!(hup(&gw).await.contains("config reloaded"));
    // The old handler fails for now: evt_1 stays queued, retried.
    old.fail.store(true, Ordering::SeqCst);
    let a = event(&gw, "evt_1").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(oncely_status(&a), Some("fresh"));
    eventually("evt_1 was tried", || got(&old, "evt_1") >= 1).await;

    // The entry now delivers elsewhere: new events go there; the queued one keeps the
    // target it was received for and is delivered once that handler recovers.
    write(&cfg, &hook_config(dir.path(), Some(new_addr)));
    assert!(hup(&gw).await.contains("config reloaded"));
    let b = event(&gw, "evt_2").await;
    assert_eq!(oncely_status(&b), Some("fresh"));
    eventually("evt_2 was delivered to the new target", || {
        got(&new, "evt_2") == 1
    })
    .await;
    old.fail.store(false, Ordering::SeqCst);
    let tries = got(&old, "evt_1");
    eventually("evt_1 was delivered after the reload", || {
        got(&old, "evt_1") > tries
    })
    .await;
    assert_eq!(got(&new, "evt_1"), 0);
    // A duplicate of an event received before the reload is still a duplicate.
    assert_eq!(oncely_status(&event(&gw, "evt_1").await), Some("duplicate"));

    // Removed: the path is no longer a webhook endpoint (forwarded to the default
    // upstream, which is not there).
    write(&cfg, &hook_config(dir.path(), None));
    assert!(hup(&gw).await.contains("config reloaded"));
    let c = event(&gw, "evt_3").await;
    assert_ne!(c.status, StatusCode::OK);
    assert_eq!(oncely_status(&c), None);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(got(&new, "evt_3") + got(&old, "evt_3"), 0);
    assert_eq!(gw.terminate().code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_during_repeated_reloads_all_succeed_and_execute_once() {
    crate::process::raise_fd_limit();
    let (up, seen) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    let one = config_text(dir.path(), &up, &["/v1/busy"], "");
    let two = config_text(
        dir.path(),
        &up,
        &["/v1/other", "/v1/busy"],
        "max_body = \"2MiB\"",
    );
    write(&cfg, &one);
    let gw = Arc::new(start(&cfg));

    const KEYS: usize = 40;
    const PER_KEY: usize = 8;
    let reloader = {
        let gw = gw.clone();
        let cfg = cfg.clone();
        tokio::spawn(async move {
            for i in 0..12 {
                write(&cfg, if i % 2 == 0 { &two } else { &one });
                let line = hup(&gw).await;
                assert!(line.contains("config reloaded"), "{line}");
            }
        })
    };
    let mut calls = Vec::new();
    for round in 0..PER_KEY {
        for k in 0..KEYS {
            let gw = gw.clone();
            calls.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis((round * 15) as u64)).await;
                call(&gw, "/v1/busy", &format!("key-{k}")).await
            }));
        }
    }
    let mut statuses: HashMap<String, usize> = HashMap::new();
    for c in calls {
        let a = c.await.unwrap();
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
        *statuses
            .entry(oncely_status(&a).unwrap_or("none").to_owned())
            .or_default() += 1;
    }
    reloader.await.unwrap();
    for k in 0..KEYS {
        assert_eq!(seen.calls("/v1/busy", &format!("key-{k}")), 1, "key-{k}");
    }
    assert_eq!(statuses.get("fresh"), Some(&KEYS), "{statuses:?}");
    assert_eq!(reloads_metric(&gw, "ok").await, 12);
    let gw = Arc::into_inner(gw).unwrap();
    assert_eq!(gw.terminate().code(), Some(0));
}

/// A config file caught while it is being rewritten in place reads empty (truncated to
/// nothing, or only a comment so far): a reload then is refused, not taken as "no routes"
/// (which forwarded guarded calls unguarded, or answered every call 502); so is one that
/// cannot be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_read_empty_or_unreadable_is_refused_and_the_old_one_kept() {
    let (up, seen) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    write(&cfg, &config_text(dir.path(), &up, &["/v1/a"], ""));
    let gw = Gateway::start(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--store",
            &format!("sqlite://{}", dir.path().join("ledger.db").display()),
        ],
        &[],
    );
    assert_eq!(oncely_status(&call(&gw, "/v1/a", "k").await), Some("fresh"));
    for half_written in ["", "\n  \n", "# oncely config\n"] {
        write(&cfg, half_written);
        let line = hup(&gw).await;
        assert!(
            line.contains("config reload refused"),
            "{half_written:?}: {line}"
        );
    }
    let lines = gw.lines.lock().unwrap().join("\n");
    assert!(
        lines
            .lines()
            .any(|l| l.contains("config reload: problem") && l.contains("empty")),
        "{lines}"
    );
    // A file that cannot be read (no permission; or gone, as mid-replace) is refused,
    // the reason logged. (Root reads a mode-000 file: then only the missing file counts.)
    let mut refused = 3;
    write(&cfg, &config_text(dir.path(), &up, &["/v1/b"], ""));
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o000)).unwrap();
        if std::fs::read(&cfg).is_err() {
            assert!(hup(&gw).await.contains("config reload refused"));
            refused += 1;
        }
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::remove_file(&cfg).unwrap();
    assert!(hup(&gw).await.contains("config reload refused"));
    refused += 1;
    let lines = gw.lines.lock().unwrap().join("\n");
    assert!(
        lines
            .lines()
            .any(|l| l.contains("config reload: problem") && l.contains("cannot read config file")),
        "{lines}"
    );
    // The running config is kept: /v1/a is still guarded, /v1/b not.
    let again = call(&gw, "/v1/a", "k").await;
    assert_eq!(oncely_status(&again), Some("replayed"));
    assert_eq!(seen.calls("/v1/a", "k"), 1);
    assert_eq!(oncely_status(&call(&gw, "/v1/b", "k").await), None);
    assert_eq!(reloads_metric(&gw, "refused").await, refused);
    assert_eq!(gw.terminate().code(), Some(0));
}

/// Replaces the file as an editor or a config manager should: a whole new file renamed
/// over the old one.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Hundreds of `SIGHUP`s in bursts (the file switching between two configs) while
/// duplicates run: every call is answered, each key executes once, the process lives on,
/// and the last file is the one in force afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_storm_while_requests_run_loses_nothing_and_ends_on_the_last_file() {
    crate::process::raise_fd_limit();
    let (up, seen) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    let one = config_text(dir.path(), &up, &["/v1/busy"], "");
    let two = config_text(dir.path(), &up, &["/v1/busy", "/v1/other"], "");
    write(&cfg, &one);
    let gw = Arc::new(start(&cfg));
    let pid = gw.pid().to_string();

    let storm = {
        let (cfg, one, two, pid) = (cfg.clone(), one.clone(), two.clone(), pid.clone());
        tokio::task::spawn_blocking(move || {
            for i in 0..20 {
                replace(&cfg, if i % 2 == 0 { &two } else { &one });
                let status = Command::new("kill")
                    .arg("-HUP")
                    .args(std::iter::repeat_n(pid.as_str(), 25))
                    .status()
                    .unwrap();
                assert!(status.success());
                std::thread::sleep(Duration::from_millis(5));
            }
            replace(&cfg, &two);
            assert!(Command::new("kill")
                .args(["-HUP", &pid])
                .status()
                .unwrap()
                .success());
        })
    };
    const KEYS: usize = 30;
    const PER_KEY: usize = 6;
    let mut calls = Vec::new();
    for round in 0..PER_KEY {
        for k in 0..KEYS {
            let gw = gw.clone();
            calls.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis((round * 10) as u64)).await;
                call(&gw, "/v1/busy", &format!("key-{k}")).await
            }));
        }
    }
    let mut fresh = 0;
    for c in calls {
        let a = c.await.unwrap();
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
        fresh += usize::from(oncely_status(&a) == Some("fresh"));
    }
    storm.await.unwrap();
    for k in 0..KEYS {
        assert_eq!(seen.calls("/v1/busy", &format!("key-{k}")), 1, "key-{k}");
    }
    assert_eq!(fresh, KEYS);
    // The last file is in force once the last reload is through: /v1/other guarded.
    let mut guarded = false;
    for i in 0..200 {
        if oncely_status(&call(&gw, "/v1/other", &format!("probe-{i}")).await).is_some() {
            guarded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(guarded, "{}", gw.lines.lock().unwrap().join("\n"));
    assert_eq!(reloads_metric(&gw, "refused").await, 0);
    assert!(reloads_metric(&gw, "ok").await >= 1);
    let gw = Arc::into_inner(gw).unwrap();
    assert_eq!(gw.terminate().code(), Some(0));
}

/// The `[tracing]` section is read at start (the exporter is built then): a reload that
/// changes it is refused, naming it, rather than answered "reloaded" and not applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tracing_section_is_refused_as_needing_a_restart() {
    let (up, seen) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    let tracing = |ratio: &str| {
        format!("[tracing]\notlp_endpoint = \"http://127.0.0.1:9\"\nsample_ratio = {ratio}\n")
    };
    // The section last: the routes are appended after `extra`.
    let text = |ratio: &str, paths: &[&str]| {
        let mut t = config_text(dir.path(), &up, paths, "");
        t.push('\n');
        t.push_str(&tracing(ratio));
        t
    };
    write(&cfg, &text("1.0", &["/v1/a"]));
    let gw = start(&cfg);
    assert_eq!(oncely_status(&call(&gw, "/v1/a", "k").await), Some("fresh"));
    // Unchanged, with a route added: reloaded.
    write(&cfg, &text("1.0", &["/v1/a", "/v1/b"]));
    assert!(hup(&gw).await.contains("config reloaded"));
    // Changed: refused, named, the running config kept.
    write(&cfg, &text("0.0", &["/v1/a"]));
    let line = hup(&gw).await;
    assert!(line.contains("config reload refused"), "{line}");
    let lines = gw.lines.lock().unwrap().join("\n");
    assert!(
        lines
            .lines()
            .any(|l| l.contains("tracing: changed, and only a restart can change it")),
        "{lines}"
    );
    assert_eq!(oncely_status(&call(&gw, "/v1/b", "k").await), Some("fresh"));
    assert_eq!(seen.calls("/v1/a", "k"), 1);
    assert_eq!(gw.terminate().code(), Some(0));
}
