//! Process-level failure tests through the real binary: a gateway killed with SIGKILL
//! while its upstream call runs, then restarted on the same SQLite ledger (a `write`
//! executes again with the same downstream key once the lease lapsed; an `action` is
//! `outcome_unknown` until `oncely ledger resolve`), the per-request log line of the
//! retry, and 1,000 concurrent identical requests.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::common::{collect, post as http_post, run, stderr, stdout, upstream, Answer, Gateway};

/// What the upstream saw: per request body, the `Idempotency-Key` of every call.
#[derive(Clone, Default)]
pub(crate) struct Seen(Arc<Mutex<HashMap<String, Vec<String>>>>);

impl Seen {
    pub(crate) fn keys(&self, body: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .get(body)
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `body` has been received `n` times.
    pub(crate) async fn wait_for(&self, body: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.keys(body).len() < n {
            assert!(
                Instant::now() < deadline,
                "the upstream did not receive {body:?} {n} time(s)"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An upstream on `path` whose first call of each body hangs for `hang` (the gateway
/// is killed meanwhile) and whose later calls answer at once, `201` with
/// `charged #N: BODY` and a `Request-Id`.
pub(crate) async fn recording_upstream(path: &str, hang: Duration) -> (String, Seen) {
    let seen = Seen::default();
    let s = seen.clone();
    let addr = upstream(axum::Router::new().route(
        path,
        post(move |headers: HeaderMap, body: String| {
            let key = headers
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let n = {
                let mut map = s.0.lock().unwrap();
                let calls = map.entry(body.clone()).or_default();
                calls.push(key);
                calls.len()
            };
            async move {
                if n == 1 {
                    tokio::time::sleep(hang).await;
                }
                (
                    http::StatusCode::CREATED,
                    [("request-id", format!("prov_{n}"))],
                    format!("charged #{n}: {body}"),
                )
            }
        }),
    ))
    .await;
    (format!("http://{addr}"), seen)
}

/// Writes a config with one route and returns its path.
fn config(dir: &Path, upstream: &str, class: &str, lease: &str, wait: &str) -> String {
    let path = dir.join("oncely.toml");
    std::fs::write(
        &path,
        format!(
            r#"
store = "sqlite://{}"
upstream = "{upstream}"

[[routes]]
method = "POST"
path = "/v1/orders"
class = "{class}"
key = "header-or-fingerprint"
principal = "header:authorization"
lease = "{lease}"
wait = "{wait}"
"#,
            dir.join("ledger.db").display()
        ),
    )
    .unwrap();
    path.display().to_string()
}

const HEADERS: [(&str, &str); 3] = [
    ("authorization", "Bearer sk_alice"),
    ("content-type", "application/json"),
    ("x-workflow-id", "wf-restart"),
];

/// Sends a request that is expected to die with the gateway: its error is ignored.
fn doomed(url: String, body: &'static str) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let mut req = Request::post(url);
        for (n, v) in HEADERS {
            req = req.header(n, v);
        }
        let _ = client
            .request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await;
    })
}

fn ledger_show(store: &str, id: &str) -> serde_json::Value {
    let out = run(&["ledger", "show", id, "--json", "--store", store]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn only_record(store: &str, state: &str) -> String {
    let out = run(&[
        "ledger", "list", "--json", "--status", state, "--store", store,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    list[0]["id"].as_str().unwrap().to_owned()
}

/// Every JSON log line of a gateway that names a record.
fn request_lines(gw: &Gateway) -> Vec<serde_json::Value> {
    gw.lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("record").is_some())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_write_executes_again_with_the_same_downstream_key_after_the_lease() {
    let (up, seen) = recording_upstream("/v1/orders", Duration::from_secs(60)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &up, "write", "2s", "15s");
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let body = r#"{"sku":"book-1","qty":1}"#;

    let first = Gateway::start(&["--config", &cfg, "--log-format", "json"], &[]);
    let lost = doomed(first.url("/v1/orders"), body);
    seen.wait_for(body, 1).await;
    let id = only_record(&store, "processing");
    // SIGKILL (Gateway's drop kills and reaps the process): no drain, no release.
    drop(first);
    let _ = lost.await;
    let record = ledger_show(&store, &id);
    assert_eq!(record["state"], "processing", "{record}");
    assert_eq!(record["attempt"], 1);

    let second = Gateway::start(&["--config", &cfg, "--log-format", "json"], &[]);
    let started = Instant::now();
    let retry = http_post(&second.url("/v1/orders"), body, &HEADERS).await;
    // The retry waited for the dead owner's lease (2s, renewed until the kill) and
    // then executed: attempt 2, the same record, the same downstream key.
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(retry.header("oncely-status"), "fresh");
    assert_eq!(retry.header("oncely-record"), id);
    assert_eq!(retry.text(), format!("charged #2: {body}"));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    let keys = seen.keys(body);
    assert_eq!(keys.len(), 2);
    assert!(!keys[0].is_empty());
    assert_eq!(keys[0], keys[1], "the same downstream key on both attempts");
    assert_ne!(keys[0], "", "the upstream got an Idempotency-Key");
    let record = ledger_show(&store, &id);
    assert_eq!(record["state"], "completed", "{record}");
    assert_eq!(record["attempt"], 2, "{record}");

    // Now it is completed: a repeat is replayed, not executed a third time.
    let again = http_post(&second.url("/v1/orders"), body, &HEADERS).await;
    assert_eq!(again.header("oncely-status"), "replayed");
    assert_eq!(again.body, retry.body);
    assert_eq!(seen.keys(body).len(), 2);

    // The retry's log line has the contract's fields, with this attempt's values.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = request_lines(&second);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let fresh = &lines[0];
    assert_eq!(fresh["record"], id.as_str(), "{fresh}");
    assert_eq!(fresh["route"], "POST /v1/orders");
    assert_eq!(fresh["status"], "fresh");
    assert_eq!(fresh["attempt"], 2, "{fresh}");
    assert_eq!(fresh["workflow_id"], "wf-restart");
    assert_eq!(fresh["upstream_status"], 201, "{fresh}");
    assert_eq!(fresh["provider_request_id"], "prov_2");
    assert!(fresh["duration_ms"].is_number(), "{fresh}");
    let principal = fresh["principal"].as_str().unwrap();
    assert_eq!(principal.len(), 64, "a keyed hash: {principal}");
    assert!(!lines.iter().any(|l| l.to_string().contains("sk_alice")));
    assert_eq!(lines[1]["status"], "replayed");
    assert_eq!(lines[1]["record"], id.as_str());
}

/// An action whose gateway was killed mid-call, its caller gone with it, becomes
/// `outcome_unknown` once the dead owner's lease has lapsed, with no duplicate ever sent:
/// a restarted gateway's sweep marks it, so the operator sees it and reconciliation can
/// ask about it. The upstream is not called again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_action_becomes_outcome_unknown_without_a_duplicate() {
    let (up, seen) = recording_upstream("/v1/orders", Duration::from_secs(60)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &up, "action", "1s", "5s");
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let order = r#"{"sku":"chair","qty":4}"#;

    let first = Gateway::start(&["--config", &cfg], &[]);
    let caller = doomed(first.url("/v1/orders"), order);
    seen.wait_for(order, 1).await;
    drop(first);
    let _ = caller.await;
    let id = only_record(&store, "processing");

    let _second = Gateway::start(&["--config", &cfg], &[]);
    let started = Instant::now();
    loop {
        let state = ledger_show(&store, &id)["state"].clone();
        if state == "outcome_unknown" {
            break;
        }
        assert_eq!(state, "processing");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still processing {:?} after the restart",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen.keys(order).len(), 1, "the upstream was called once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_action_is_outcome_unknown_until_resolved() {
    let (up, seen) = recording_upstream("/v1/orders", Duration::from_secs(60)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &up, "action", "2s", "15s");
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let released = r#"{"sku":"lamp","qty":1}"#;
    let completed = r#"{"sku":"desk","qty":1}"#;

    let first = Gateway::start(&["--config", &cfg], &[]);
    let a = doomed(first.url("/v1/orders"), released);
    let b = doomed(first.url("/v1/orders"), completed);
    seen.wait_for(released, 1).await;
    seen.wait_for(completed, 1).await;
    drop(first);
    let _ = (a.await, b.await);

    let second = Gateway::start(&["--config", &cfg], &[]);
    let url = second.url("/v1/orders");
    // Once the dead owner's lease lapses, nobody can know whether the order was
    // placed: 409 outcome_unknown, and the upstream is not called again.
    let unknown = http_post(&url, released, &HEADERS).await;
    assert_outcome_unknown(&unknown);
    let id_released = unknown.header("oncely-record").to_owned();
    let unknown = http_post(&url, completed, &HEADERS).await;
    assert_outcome_unknown(&unknown);
    let id_completed = unknown.header("oncely-record").to_owned();
    // Asked again: still 409, at once.
    let started = Instant::now();
    let unknown = http_post(&url, released, &HEADERS).await;
    assert_outcome_unknown(&unknown);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(seen.keys(released).len(), 1);
    assert_eq!(seen.keys(completed).len(), 1);
    assert_eq!(
        ledger_show(&store, &id_released)["state"],
        "outcome_unknown"
    );

    // Resolved as "did not happen": the next identical request executes afresh, with
    // the same downstream key.
    let out = run(&[
        "ledger",
        "resolve",
        &id_released,
        "--released",
        "--store",
        &store,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let again = http_post(&url, released, &HEADERS).await;
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.header("oncely-status"), "fresh");
    assert_eq!(again.text(), format!("charged #2: {released}"));
    let keys = seen.keys(released);
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);

    // Resolved as "happened": duplicates get the operator's answer, never a second
    // order.
    let body_file = dir.path().join("order.json");
    std::fs::write(&body_file, r#"{"order":"ord_77","state":"placed"}"#).unwrap();
    let out = run(&[
        "ledger",
        "resolve",
        &id_completed,
        "--completed",
        "--status",
        "201",
        "--body-file",
        &body_file.display().to_string(),
        "--header",
        "Content-Type: application/json",
        "--store",
        &store,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let replay = http_post(&url, completed, &HEADERS).await;
    assert_eq!(replay.status, 201, "{}", replay.text());
    assert_eq!(replay.header("oncely-status"), "replayed");
    assert_eq!(replay.header("content-type"), "application/json");
    assert_eq!(replay.json()["order"], "ord_77");
    assert_eq!(seen.keys(completed).len(), 1, "never executed twice");
}

#[track_caller]
fn assert_outcome_unknown(a: &Answer) {
    assert_eq!(a.status, 409, "{}", a.text());
    assert_eq!(a.header("content-type"), "application/problem+json");
    assert_eq!(a.json()["code"], "outcome_unknown", "{}", a.text());
}

/// Raises this process's soft file-descriptor limit to its hard limit (children
/// inherit it), so that 1,000 client sockets plus the gateway's fit.
pub(crate) fn raise_fd_limit() {
    let pid = std::process::id().to_string();
    let hard = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &pid,
            "--nofile",
            "--raw",
            "--noheadings",
            "-o",
            "HARD",
        ])
        .output();
    if let Ok(out) = hard {
        let hard = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !hard.is_empty() {
            let _ = std::process::Command::new("prlimit")
                .args(["--pid", &pid, &format!("--nofile={hard}:{hard}")])
                .status();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_identical_requests_execute_once_and_all_are_answered() {
    const N: usize = 1000;
    raise_fd_limit();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = calls.clone();
    let up = upstream(axum::Router::new().route(
        "/v1/render",
        post(move |body: String| {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move {
                // Long enough for all the duplicates to arrive while it runs.
                tokio::time::sleep(Duration::from_secs(2)).await;
                format!("render #{n} of {body}")
            }
        }),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let gw = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", &store],
        &[],
    );
    let url = gw.url("/v1/render");
    // A few clients, each with its own pool, so that every request has a connection.
    let clients: Vec<Client<_, Full<Bytes>>> = (0..4)
        .map(|_| {
            Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(N)
                .build_http()
        })
        .collect();
    let started = Instant::now();
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let client = clients[i % clients.len()].clone();
            let url = url.clone();
            tokio::spawn(async move {
                let req = Request::post(url)
                    .header("authorization", "Bearer sk_many")
                    .body(Full::new(Bytes::from_static(b"chapter 9")))
                    .unwrap();
                let res = client.request(req).await.expect("answered");
                collect(res).await
            })
        })
        .collect();
    let mut statuses: HashMap<String, usize> = HashMap::new();
    let mut bodies = std::collections::HashSet::new();
    for t in tasks {
        let a = t.await.unwrap();
        assert_eq!(a.status, 200, "{}", a.text());
        *statuses
            .entry(a.header("oncely-status").to_owned())
            .or_default() += 1;
        bodies.insert(a.body.clone());
    }
    let elapsed = started.elapsed();
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "{statuses:?}"
    );
    assert_eq!(statuses.values().sum::<usize>(), N);
    assert_eq!(statuses.get("fresh"), Some(&1), "{statuses:?}");
    assert_eq!(bodies.len(), 1, "every caller got the same answer");
    assert_eq!(
        bodies.into_iter().next().unwrap(),
        Bytes::from_static(b"render #1 of chapter 9")
    );
    eprintln!("{N} identical requests answered in {elapsed:?}: {statuses:?}");
}
