//! Secrets at rest, through the real binary: what a queued job keeps (its `Authorization`
//! header, its body, its query) never appears in the ledger's files, while it waits,
//! while it runs and after; the job still reaches the upstream intact; the ledger's
//! files and the job key file are owner-only; the key file is reused after a restart; a
//! PostgreSQL ledger with a job route and no `ONCELY_SECRET_KEY`, or a bad one, refuses
//! to start. MCP: a metric label taken from client input (a tool name) is
//! bounded, an empty principal header is a missing one, and JWT principals check `aud`,
//! `iss` and `exp`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{RawQuery, State};
use axum::routing::post;
use http::HeaderMap;
use tokio::sync::watch;

use crate::common::{assert_usage_error, get, oncely, post as http_post, upstream, Gateway};

const SECRET: &str = "Bearer sk_secret_7f3c9a1e5d2b";
const BODY_MARK: &str = "distinctive-payload-4b8e2f";
const QUERY_MARK: &str = "qtoken-91ad7c";

/// What the upstream saw of each call: authorization, query and body.
#[derive(Clone)]
struct Seen {
    calls: Arc<Mutex<Vec<(String, String, String)>>>,
    gate: watch::Receiver<bool>,
}

/// `POST /v1/render`: notes the call, then answers 201 once the gate is open.
fn service(seen: Seen) -> axum::Router {
    axum::Router::new()
        .route(
            "/v1/render",
            post(
                |State(s): State<Seen>, RawQuery(q): RawQuery, headers: HeaderMap, body: String| async move {
                    let auth = headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    s.calls
                        .lock()
                        .unwrap()
                        .push((auth, q.unwrap_or_default(), body));
                    let mut gate = s.gate.clone();
                    let _ = gate.wait_for(|open| *open).await;
                    (http::StatusCode::CREATED, "{\"audio\":\"done.mp3\"}")
                },
            ),
        )
        .with_state(seen)
}

fn config(dir: &Path, store: &str, up: std::net::SocketAddr) -> String {
    let cfg = dir.join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = {store:?}
upstream = "http://{up}"
[[routes]]
method = "POST"
path = "/v1/render"
class = "job"
wait = "200ms"
timeout = "3s"
lease = "1s"
concurrency = 1
"#
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_owned()
}

async fn submit(gw: &Gateway, n: usize) -> String {
    let a = http_post(
        &gw.url(&format!("/v1/render?token={QUERY_MARK}")),
        &format!(r#"{{"text":"{BODY_MARK}-{n}"}}"#),
        &[
            ("authorization", SECRET),
            ("content-type", "application/json"),
        ],
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text());
    a.header("location").to_owned()
}

async fn until_done(gw: &Gateway, location: &str) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let s = get(&gw.url(location), &[("authorization", SECRET)]).await;
        assert_eq!(s.status, 200, "{}", s.text());
        let v = s.json();
        if v["status"] != "running" || start.elapsed() > Duration::from_secs(20) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn until_calls(seen: &Seen, n: usize) {
    let start = Instant::now();
    while seen.calls.lock().unwrap().len() < n && start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.calls.lock().unwrap().len(), n, "upstream calls");
}

fn ledger_files(db: &Path) -> Vec<PathBuf> {
    ["", "-wal", "-shm"]
        .iter()
        .map(|s| PathBuf::from(format!("{}{s}", db.display())))
        .filter(|p| p.exists())
        .collect()
}

/// The raw bytes of the db, -wal and -shm files hold none of the job's secrets.
#[track_caller]
fn assert_clean(db: &Path, when: &str) {
    let files = ledger_files(db);
    assert!(files.len() >= 2, "db and wal exist: {files:?}");
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        for needle in ["sk_secret_7f3c9a1e5d2b", BODY_MARK, QUERY_MARK] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{needle} found in {} {when}",
                f.display()
            );
        }
    }
}

#[cfg(unix)]
#[track_caller]
fn assert_owner_only(files: &[PathBuf]) {
    use std::os::unix::fs::PermissionsExt as _;
    for f in files {
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} is {mode:o}", f.display());
    }
}

/// Concurrency 1: job 1 runs (held at the upstream), job 2 waits in the queue. While
/// both are held and after both ran, the ledger's files hold neither the bearer token,
/// the body nor the query; the upstream got them intact; every file is 0600.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_jobs_credentials_never_reach_the_ledger_files() {
    let (open, gate) = watch::channel(false);
    let seen = Seen {
        calls: Arc::default(),
        gate,
    };
    let up = upstream(service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let cfg = config(dir.path(), &format!("sqlite://{}", db.display()), up);
    let gw = Gateway::start(&["--config", &cfg], &[]);

    let first = submit(&gw, 1).await;
    let second = submit(&gw, 2).await;
    until_calls(&seen, 1).await;
    assert_clean(&db, "while one job runs and one waits");

    open.send(true).unwrap();
    for location in [&first, &second] {
        assert_eq!(until_done(&gw, location).await["status"], "completed");
    }
    assert_clean(&db, "after the jobs ran");
    let calls = seen.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
    for (n, (auth, query, body)) in calls.iter().enumerate() {
        assert_eq!(auth, SECRET, "the upstream got the credentials");
        assert_eq!(query, &format!("token={QUERY_MARK}"));
        assert_eq!(body, &format!(r#"{{"text":"{BODY_MARK}-{}"}}"#, n + 1));
    }
    #[cfg(unix)]
    {
        let mut files = ledger_files(&db);
        files.push(dir.path().join("ledger.db.key"));
        assert_eq!(files.len(), 4, "db, wal, shm and key: {files:?}");
        assert_owner_only(&files);
    }
    drop(gw);
}

/// The key file is created on the first start and reused after a SIGKILL: a job that
/// was queued before the restart opens with it and runs with its headers and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_survives_a_restart_with_its_key_file() {
    let (open, gate) = watch::channel(false);
    let seen = Seen {
        calls: Arc::default(),
        gate,
    };
    let up = upstream(service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let key_file = dir.path().join("ledger.db.key");
    let cfg = config(dir.path(), &format!("sqlite://{}", db.display()), up);
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let held = submit(&gw, 1).await;
    let queued = submit(&gw, 2).await;
    until_calls(&seen, 1).await;
    let key = std::fs::read(&key_file).unwrap();
    drop(gw); // SIGKILL: job 1 cut off mid-call, job 2 still queued

    open.send(true).unwrap();
    let gw = Gateway::start(&["--config", &cfg], &[]);
    for location in [&held, &queued] {
        assert_eq!(until_done(&gw, location).await["status"], "completed");
    }
    assert_eq!(
        std::fs::read(&key_file).unwrap(),
        key,
        "the key file is reused"
    );
    let calls = seen.calls.lock().unwrap().clone();
    let queued_runs: Vec<_> = calls
        .iter()
        .filter(|(_, _, body)| body.contains(&format!("{BODY_MARK}-2")))
        .collect();
    assert_eq!(queued_runs.len(), 1, "the queued job ran once: {calls:?}");
    assert_eq!(queued_runs[0].0, SECRET);
    assert_eq!(queued_runs[0].1, format!("token={QUERY_MARK}"));
    assert_clean(&db, "after the restart");
}

/// A job queued under one `ONCELY_SECRET_KEY` and found by a gateway with another does
/// not open: it fails (its record is released, nothing reaches the upstream with a
/// garbled request), and the client's retry queues it again under the new key and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_sealed_under_an_old_key_fails_and_its_retry_runs() {
    const OLD: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    const NEW: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";
    let (open, gate) = watch::channel(false);
    let seen = Seen {
        calls: Arc::default(),
        gate,
    };
    let up = upstream(service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let cfg = config(dir.path(), &format!("sqlite://{}", db.display()), up);
    let gw = Gateway::start(&["--config", &cfg], &[("ONCELY_SECRET_KEY", OLD)]);
    let _held = submit(&gw, 1).await;
    let queued = submit(&gw, 2).await;
    until_calls(&seen, 1).await;
    drop(gw); // SIGKILL with job 2 still queued, sealed under OLD
    assert!(
        !dir.path().join("ledger.db.key").exists(),
        "the env key is used"
    );

    open.send(true).unwrap();
    let gw = Gateway::start(&["--config", &cfg], &[("ONCELY_SECRET_KEY", NEW)]);
    let failed = until_done(&gw, &queued).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let runs_of_2 = |seen: &Seen| {
        let calls = seen.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(_, _, b)| b.contains(&format!("{BODY_MARK}-2")))
            .count()
    };
    assert_eq!(
        runs_of_2(&seen),
        0,
        "nothing ran for the job that did not open"
    );
    let again = submit_or_done(&gw, 2).await;
    assert_eq!(until_done(&gw, &again).await["status"], "completed");
    assert_eq!(runs_of_2(&seen), 1);
    let calls = seen.calls.lock().unwrap().clone();
    let run = calls
        .iter()
        .find(|(_, _, b)| b.contains(&format!("{BODY_MARK}-2")))
        .unwrap();
    assert_eq!(run.0, SECRET);
}

/// Sends job `n` again: 202 (queued) or, if it ran within `wait`, its answer; either way
/// its status location.
async fn submit_or_done(gw: &Gateway, n: usize) -> String {
    let a = http_post(
        &gw.url(&format!("/v1/render?token={QUERY_MARK}")),
        &format!(r#"{{"text":"{BODY_MARK}-{n}"}}"#),
        &[
            ("authorization", SECRET),
            ("content-type", "application/json"),
        ],
    )
    .await;
    match a.status.as_u16() {
        202 => a.header("location").to_owned(),
        201 => format!("/_oncely/jobs/{}", a.header("oncely-record")),
        other => panic!("unexpected {other}: {}", a.text()),
    }
}

/// `oncely serve` on this config and environment, run to its exit.
fn serve_output(cfg: &str, envs: &[(&str, &str)]) -> std::process::Output {
    oncely()
        .args([
            "serve",
            "--config",
            cfg,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_with_a_job_route_and_no_key_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    // The database is never reached: the key is checked first.
    let cfg = config(
        dir.path(),
        "postgres://oncely@127.0.0.1:1/none",
        "127.0.0.1:9".parse().unwrap(),
    );
    let out = tokio::task::spawn_blocking(move || serve_output(&cfg, &[]))
        .await
        .unwrap();
    assert_usage_error(&out, "needs ONCELY_SECRET_KEY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_secret_key_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let cfg = config(
        dir.path(),
        &format!("sqlite://{}", db.display()),
        "127.0.0.1:9".parse().unwrap(),
    );
    for (bad, why) in [
        ("not base64 at all!", "not base64"),
        ("c2hvcnQ=", "5 bytes, not 32"),
    ] {
        let cfg = cfg.clone();
        let out =
            tokio::task::spawn_blocking(move || serve_output(&cfg, &[("ONCELY_SECRET_KEY", bad)]))
                .await
                .unwrap();
        assert_usage_error(&out, "ONCELY_SECRET_KEY");
        assert_usage_error(&out, why);
    }
    assert!(!db.exists(), "nothing was opened");
}

/// A small MCP server (JSON answers): `tools/list` names `render`; every `tools/call`
/// answers a text result and is counted.
fn mcp_service(calls: Arc<AtomicUsize>) -> axum::Router {
    axum::Router::new().route(
        "/mcp",
        post(move |body: axum::Json<serde_json::Value>| {
            let calls = calls.clone();
            async move {
                let m = body.0;
                let result = match m["method"].as_str() {
                    Some("tools/list") => {
                        serde_json::json!({"tools": [{"name": "render", "inputSchema": {"type": "object"}}]})
                    }
                    _ => {
                        calls.fetch_add(1, Ordering::SeqCst);
                        serde_json::json!({"content": [{"type": "text", "text": "ok"}]})
                    }
                };
                axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": m["id"], "result": result}))
            }
        }),
    )
}

async fn mcp_as(
    gw: &Gateway,
    path: &str,
    auth: &str,
    id: usize,
    method: &str,
    params: serde_json::Value,
) {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let a = http_post(
        &gw.url(path),
        &body.to_string(),
        &[
            ("authorization", auth),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-11-25"),
        ],
    )
    .await;
    assert!(a.status.is_success(), "{}: {}", a.status, a.text());
}

async fn mcp_post(gw: &Gateway, id: usize, method: &str, params: serde_json::Value) {
    mcp_as(gw, "/mcp", "Bearer sk_alice", id, method, params).await
}

/// A config with `[[mcp]]` entries (their TOML after the store and upstream).
fn mcp_config(dir: &Path, entries: &str) -> String {
    let cfg = dir.join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            "store = \"sqlite://{}\"\nupstream = \"http://127.0.0.1:9\"\n{entries}",
            dir.join("ledger.db").display()
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_owned()
}

/// A client picks the tool names it calls: 1000 distinct unknown names add no series to
/// `/metrics` beyond one `other`, while a listed tool keeps its own label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_unknown_tool_names_leave_metrics_bounded() {
    let up = upstream(mcp_service(Arc::default())).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = mcp_config(
        dir.path(),
        &format!("[[mcp]]\npath = \"/mcp\"\nupstream = \"http://{up}/mcp\"\n"),
    );
    let gw = Arc::new(Gateway::start(&["--config", &cfg], &[]));
    mcp_post(&gw, 1, "tools/list", serde_json::json!({})).await;
    mcp_post(
        &gw,
        2,
        "tools/call",
        serde_json::json!({"name": "render", "arguments": {}}),
    )
    .await;
    let callers: Vec<_> = (0..10)
        .map(|c| {
            let gw = gw.clone();
            tokio::spawn(async move {
                for i in 0..100 {
                    let n = c * 100 + i;
                    let params = serde_json::json!({"name": format!("tool-{n}"), "arguments": {}});
                    mcp_post(&gw, 10 + n, "tools/call", params).await;
                }
            })
        })
        .collect();
    for c in callers {
        c.await.unwrap();
    }
    let metrics = get(&gw.admin_url("/metrics"), &[]).await.text();
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("oncely_requests_total{") && l.contains("tool="))
        .collect();
    assert!(
        !metrics.contains("tool-"),
        "an unknown tool name became a label"
    );
    assert!(series.len() <= 8, "{series:#?}");
    let count = |tool: &str| -> u64 {
        series
            .iter()
            .filter(|l| l.contains(&format!("tool=\"{tool}\"")))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(count("other"), 1000, "{series:#?}");
    assert_eq!(count("render"), 1, "{series:#?}");
}

/// An empty principal header names no account: such calls are forwarded unguarded, never
/// answered with another empty-header caller's stored result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_principal_header_is_a_missing_one() {
    let calls = Arc::new(AtomicUsize::new(0));
    let up = upstream(mcp_service(calls.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = mcp_config(
        dir.path(),
        &format!("[[mcp]]\npath = \"/mcp\"\nupstream = \"http://{up}/mcp\"\n"),
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let params = serde_json::json!({"name": "render", "arguments": {"text": "x"}});
    mcp_as(&gw, "/mcp", "", 1, "tools/call", params.clone()).await;
    mcp_as(&gw, "/mcp", "", 2, "tools/call", params.clone()).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "both forwarded, none replayed"
    );
    // A real principal is guarded: its repeat is replayed.
    mcp_as(&gw, "/mcp", "Bearer sk_a", 3, "tools/call", params.clone()).await;
    mcp_as(&gw, "/mcp", "Bearer sk_a", 4, "tools/call", params).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// `jwt:sub` with `jwt_audience` and `jwt_issuer`: only a token with the right `aud`,
/// `iss` and a numeric `exp` names an account (its repeat is replayed); a wrong `aud`,
/// a wrong `iss`, no `exp` or a string `exp` is not trusted, and the call is forwarded
/// unguarded every time. With `jwt_require_exp = false` a token without `exp` is trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_principals_check_audience_issuer_and_expiry() {
    use oncely_mcp::principal::sign_hs256;
    let calls = Arc::new(AtomicUsize::new(0));
    let up = upstream(mcp_service(calls.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let entry = |path: &str, extra: &str| {
        format!(
            "[[mcp]]\npath = \"{path}\"\nupstream = \"http://{up}/mcp\"\nprincipal = \"jwt:sub\"\n\
             jwt_secret_env = \"TEST_JWT_SECRET\"\njwt_audience = \"https://api.example\"\n\
             jwt_issuer = \"https://issuer.example\"\n{extra}\n"
        )
    };
    let cfg = mcp_config(
        dir.path(),
        &format!(
            "{}{}",
            entry("/mcp", ""),
            entry("/mcp-lax", "jwt_require_exp = false")
        ),
    );
    let gw = Gateway::start(&["--config", &cfg], &[("TEST_JWT_SECRET", "jwt-s3cret")]);
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let good = serde_json::json!({"sub": "acct_1", "exp": exp, "aud": "https://api.example", "iss": "https://issuer.example"});
    let with = |change: &dyn Fn(&mut serde_json::Value)| {
        let mut claims = good.clone();
        change(&mut claims);
        format!("Bearer {}", sign_hs256(&claims, b"jwt-s3cret"))
    };
    let cases: Vec<(&str, &str, String, usize)> = vec![
        ("/mcp", "good", with(&|_| {}), 1),
        (
            "/mcp",
            "wrong aud",
            with(&|c| c["aud"] = "https://other.example".into()),
            2,
        ),
        (
            "/mcp",
            "wrong iss",
            with(&|c| c["iss"] = "https://evil.example".into()),
            2,
        ),
        (
            "/mcp",
            "no exp",
            with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            }),
            2,
        ),
        (
            "/mcp",
            "string exp",
            with(&|c| c["exp"] = exp.to_string().into()),
            2,
        ),
        (
            "/mcp-lax",
            "no exp, not required",
            with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            }),
            1,
        ),
    ];
    let mut id = 0;
    for (path, what, token, runs) in cases {
        let before = calls.load(Ordering::SeqCst);
        let params = serde_json::json!({"name": "render", "arguments": {"case": what}});
        for _ in 0..2 {
            id += 1;
            mcp_as(&gw, path, &token, id, "tools/call", params.clone()).await;
        }
        assert_eq!(calls.load(Ordering::SeqCst) - before, runs, "{what}");
    }
}
