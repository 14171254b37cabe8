//! A ledger that stops answering without closing its connections, at every entry point,
//! through the real binary: PostgreSQL with every server process SIGSTOPped (warm pooled
//! connections stay open, nothing answers on them), and SQLite with its write lock held
//! by another process past the busy timeout. Every answer that needs the ledger comes
//! within the bound of one ledger operation (10 s) in its entry point's form (503
//! `store_unavailable`, exit 2 for the CLI); nothing runs while the ledger cannot record
//! it (a guarded route, a job, a webhook's ingress, an `[[mcp]]` tool call, the admin API,
//! the console, the CLI); afterwards each intention runs exactly once and its repeats
//! replay, and the jobs
//! that were running and queued across the pause each run once.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use oncely_store_conformance::testing::PgServer;
use oncely_webhooks::{sign, Scheme, Secrets};

use crate::common::{get, oncely, post as http_post, upstream, Answer, Gateway};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const TOKEN: &str = "paused-admin-t0ken";
const ALICE: (&str, &str) = ("authorization", "Bearer alice");
/// The bound of one ledger operation (`oncely_store::ANSWER_WITHIN`), and how late an
/// answer may come past it on a busy test machine.
const BOUND: Duration = Duration::from_secs(10);
const SLACK: Duration = Duration::from_secs(3);

/// Every execution the upstream saw, by body, and every webhook delivery, by body.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashMap<String, usize>>>);

impl Seen {
    fn of(&self, needle: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(body, _)| body.contains(needle))
            .map(|(_, n)| n)
            .sum()
    }
}

async fn count(State(seen): State<Seen>, body: String) -> String {
    let ms = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["ms"].as_u64())
        .unwrap_or(0);
    *seen.0.lock().unwrap().entry(body.clone()).or_default() += 1;
    tokio::time::sleep(Duration::from_millis(ms)).await;
    format!("done: {body}")
}

async fn delivered(State(seen): State<Seen>, _: HeaderMap, body: String) -> StatusCode {
    *seen.0.lock().unwrap().entry(body).or_default() += 1;
    StatusCode::OK
}

/// A small MCP server (Streamable HTTP, JSON answers, no session): `initialize`,
/// `tools/list` with one paid tool, and `tools/call`, counted by its `text` argument.
async fn mcp_server(State(seen): State<Seen>, body: String) -> axum::response::Response {
    use axum::response::IntoResponse;
    let m: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let Some(id) = m.get("id").cloned() else {
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match m["method"].as_str().unwrap_or_default() {
        "initialize" => serde_json::json!({
            "protocolVersion": m["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "paid", "version": "1"},
        }),
        "tools/list" => serde_json::json!({"tools": [{
            "name": "render", "inputSchema": {"type": "object"},
        }]}),
        "tools/call" => {
            let text = m["params"]["arguments"]["text"]
                .as_str()
                .unwrap_or_default();
            *seen
                .0
                .lock()
                .unwrap()
                .entry(format!("mcp {text}"))
                .or_default() += 1;
            serde_json::json!({"content": [{"type": "text", "text": format!("rendered {text}")}]})
        }
        _ => serde_json::json!({}),
    };
    axum::Json(serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}

/// A `tools/call` of the paid tool through the gateway's `[[mcp]]` endpoint.
async fn tool_call(gw: &Gateway, text: &str) -> Answer {
    let message = serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "render", "arguments": {"text": text}}});
    http_post(
        &gw.url("/mcp"),
        &message.to_string(),
        &[
            ALICE,
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-11-25"),
        ],
    )
    .await
}

fn config(dir: &std::path::Path, store: &str, up: std::net::SocketAddr) -> String {
    let path = dir.join("oncely.toml");
    std::fs::write(
        &path,
        format!(
            r#"
store = "{store}"
upstream = "http://{up}"
admin_token_env = "TEST_ADMIN_TOKEN"

[[routes]]
method = "POST"
path = "/v1/call"
class = "write"
principal = "header:authorization"

[[routes]]
method = "POST"
path = "/v1/slow"
class = "action"
principal = "header:authorization"
timeout = "2s"

[[routes]]
method = "POST"
path = "/v1/render"
class = "job"
principal = "header:authorization"
wait = "1s"
lease = "2s"
timeout = "60s"
concurrency = 1

[[webhooks]]
path = "/hooks/events"
verify = "standard"
secret_env = "TEST_WEBHOOK_SECRET"
tolerance = "5m"
deliver_to = "http://{up}/internal/events"
deliver_timeout = "5s"

[[mcp]]
path = "/mcp"
upstream = "http://{up}/mcp"
principal = "header:authorization"
tools = ["*"]
"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn signed(event_id: &str, body: &str) -> Vec<(String, String)> {
    let scheme: Scheme = "standard".parse().unwrap();
    let secrets = Secrets::parse(&scheme, SECRET).unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut headers = sign(&scheme, secrets.primary(), event_id, now, body.as_bytes());
    headers.push(("content-type".into(), "application/json".into()));
    headers
}

async fn webhook(gw: &Gateway, event: &str) -> Answer {
    let body = format!(r#"{{"id":"{event}","type":"invoice.paid"}}"#);
    let headers = signed(event, &body);
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    http_post(&gw.url("/hooks/events"), &body, &h).await
}

fn render(text: &str, ms: u64) -> String {
    format!(r#"{{"text":"{text}","ms":{ms}}}"#)
}

async fn job_state(gw: &Gateway, location: &str) -> String {
    let status = get(&gw.url(location), &[ALICE]).await;
    assert_eq!(status.status, 200, "{}", status.text());
    status.json()["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting until {what}");
}

/// What one entry point answered while the ledger was dark, and how long it took.
struct Dark {
    what: &'static str,
    took: Duration,
    status: u16,
    body: String,
}

async fn timed(what: &'static str, answer: impl std::future::Future<Output = Answer>) -> Dark {
    let started = Instant::now();
    let a = answer.await;
    Dark {
        what,
        took: started.elapsed(),
        status: a.status.as_u16(),
        body: a.text(),
    }
}

/// `oncely ledger list` on the dark ledger: exit 2 and one line, within the bound.
async fn cli_list(store: String) -> Dark {
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        oncely()
            .args(["ledger", "list", "--store", &store])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    Dark {
        what: "oncely ledger list",
        took: started.elapsed(),
        status: out.status.code().unwrap_or(-1) as u16,
        body: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Everything before the ledger goes dark: warm connections, a finished job (its status
/// is read in the dark), a job running across the pause and one queued behind it.
struct Before {
    done_job: String,
    running_job: String,
    queued_job: String,
}

async fn before(gw: &Gateway) -> Before {
    // Warm the pool: several connections are open (and idle) when the ledger goes dark.
    let warm: Vec<_> = (0..6)
        .map(|i| http_post_owned(gw.url("/v1/call"), format!("warm {i}")))
        .collect();
    for a in futures::future::join_all(warm).await {
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let done = http_post(&gw.url("/v1/render"), &render("done", 0), &[ALICE]).await;
    assert!(done.status == 200 || done.status == 202, "{}", done.text());
    let warm_tool = tool_call(gw, "warm").await;
    assert_eq!(warm_tool.status, 200, "{}", warm_tool.text());
    let warm_hook = webhook(gw, "evt_warm").await;
    assert_eq!(warm_hook.status, 200, "{}", warm_hook.text());
    let admin = get(
        &gw.admin_url("/records"),
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_eq!(admin.status, 200, "{}", admin.text());
    // A job that runs across the pause, and one queued behind it (concurrency 1).
    let running = http_post(&gw.url("/v1/render"), &render("running", 8000), &[ALICE]).await;
    assert_eq!(running.status, 202, "{}", running.text());
    let queued = http_post(&gw.url("/v1/render"), &render("queued", 0), &[ALICE]).await;
    assert_eq!(queued.status, 202, "{}", queued.text());
    Before {
        done_job: format!("/_oncely/jobs/{}", done.header("oncely-record")),
        running_job: running.header("location").to_owned(),
        queued_job: queued.header("location").to_owned(),
    }
}

async fn http_post_owned(url: String, body: String) -> Answer {
    http_post(&url, &body, &[ALICE]).await
}

/// Every entry point at once while the ledger is dark.
async fn in_the_dark(gw: &Gateway, store: &str, b: &Before) -> Vec<Dark> {
    let admin_auth = format!("Bearer {TOKEN}");
    let admin = [("authorization", admin_auth.as_str())];
    let (call, job) = (gw.url("/v1/call"), gw.url("/v1/render"));
    let (status, records) = (gw.url(&b.done_job), gw.admin_url("/records"));
    let (inflight, dark_job) = (gw.admin_url("/console/inflight"), render("dark job", 0));
    let (guarded, submit, status, hook, records, inflight, cli, tool) = tokio::join!(
        timed("guarded route", http_post(&call, "in the dark", &[ALICE])),
        timed("job submission", http_post(&job, &dark_job, &[ALICE])),
        timed("job status", get(&status, &[ALICE])),
        timed("webhook ingress", webhook(gw, "evt_dark")),
        timed("admin GET /records", get(&records, &admin)),
        timed("console /console/inflight", get(&inflight, &admin)),
        cli_list(store.to_owned()),
        timed("[[mcp]] tools/call", tool_call(gw, "dark tool")),
    );
    vec![guarded, submit, status, hook, records, inflight, cli, tool]
}

fn assert_bounded(dark: &[Dark]) {
    for d in dark {
        eprintln!(
            "in the dark: {} answered {} after {:?}",
            d.what, d.status, d.took
        );
        assert!(
            d.took < BOUND + SLACK,
            "{} answered after {:?} (status {}): {}",
            d.what,
            d.took,
            d.status,
            d.body
        );
        if d.what == "oncely ledger list" {
            assert_eq!(d.status, 2, "{}: {}", d.what, d.body);
            assert_eq!(d.body.trim().lines().count(), 1, "{}: {}", d.what, d.body);
            continue;
        }
        assert_eq!(d.status, 503, "{}: {}", d.what, d.body);
        if !d.what.starts_with("console") && !d.what.starts_with("admin") {
            let problem: serde_json::Value = serde_json::from_str(&d.body)
                .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", d.what, d.body));
            assert_eq!(
                problem["code"], "store_unavailable",
                "{}: {}",
                d.what, d.body
            );
        }
    }
}

/// While the ledger is still dark: nothing was sent, run or delivered for a request it
/// could not record.
fn nothing_ran_in_the_dark(calls: &Seen, hooks: &Seen) {
    assert_eq!(calls.of("in the dark"), 0, "a refused request was sent");
    assert_eq!(
        calls.of("dark job"),
        0,
        "a job ran while the ledger was dark"
    );
    assert_eq!(
        calls.of("mcp dark tool"),
        0,
        "a tool ran while the ledger was dark"
    );
    assert_eq!(
        hooks.of("evt_dark"),
        0,
        "an event was delivered while the ledger was dark"
    );
}

/// After the ledger is back: each intention runs once when it is asked again, and
/// repeats replay. A guarded request's claim that landed late was released unsent; a
/// job's or an event's that landed late stands, and runs once (its retry finds it).
async fn after(gw: &Gateway, calls: &Seen, hooks: &Seen, b: &Before) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(calls.of("in the dark"), 0, "a refused request was sent");
    assert!(calls.of("dark job") <= 1, "a late-queued job ran twice");
    assert!(
        hooks.of("evt_dark") <= 1,
        "a late-queued event was delivered twice"
    );

    let again = http_post(&gw.url("/v1/call"), "in the dark", &[ALICE]).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("oncely-status"), "fresh");
    let dup = http_post(&gw.url("/v1/call"), "in the dark", &[ALICE]).await;
    assert_eq!(dup.header("oncely-status"), "replayed", "{}", dup.text());
    assert_eq!(calls.of("in the dark"), 1);

    let tool = tool_call(gw, "dark tool").await;
    assert_eq!(tool.status, 200, "{}", tool.text());
    let tool_dup = tool_call(gw, "dark tool").await;
    assert_eq!(tool_dup.status, 200, "{}", tool_dup.text());
    let replayed = tool_dup.json();
    assert_eq!(
        replayed["result"]["content"],
        tool.json()["result"]["content"]
    );
    assert_eq!(
        replayed["result"]["_meta"]["dev.oncely/replay"]["status"], "replayed",
        "{replayed}"
    );
    assert_eq!(
        calls.of("mcp dark tool"),
        1,
        "the tool call ran other than once"
    );

    let hook = webhook(gw, "evt_dark").await;
    assert_eq!(hook.status, 200, "{}", hook.text());
    let hook_dup = webhook(gw, "evt_dark").await;
    assert_eq!(hook_dup.status, 200, "{}", hook_dup.text());

    let job = http_post(&gw.url("/v1/render"), &render("dark job", 0), &[ALICE]).await;
    assert!(job.status == 200 || job.status == 202, "{}", job.text());
    let location = format!("/_oncely/jobs/{}", job.header("oncely-record"));

    // The running job and the queued one each run once; so does the job asked again.
    for (what, location) in [
        ("running", b.running_job.as_str()),
        ("queued", b.queued_job.as_str()),
        ("dark job", location.as_str()),
    ] {
        let until = Instant::now() + Duration::from_secs(40);
        loop {
            let state = job_state(gw, location).await;
            if state == "completed" {
                break;
            }
            assert!(Instant::now() < until, "the {what} job is still {state}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    eventually("the event is delivered", Duration::from_secs(20), || {
        hooks.of("evt_dark") >= 1
    })
    .await;
    // Time for anything that would run twice to do so.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(calls.of("\"running\""), 1, "the running job ran again");
    assert_eq!(
        calls.of("\"queued\""),
        1,
        "the queued job ran other than once"
    );
    assert_eq!(
        calls.of("dark job"),
        1,
        "the job asked again ran other than once"
    );
    assert_eq!(
        hooks.of("evt_dark"),
        1,
        "the event was delivered other than once"
    );
    assert_eq!(calls.of("in the dark"), 1);
    assert_eq!(
        get(&gw.url(&location), &[ALICE]).await.json()["status"],
        "completed"
    );
}

async fn serve(store: &str, dir: &std::path::Path) -> (Gateway, Seen, Seen) {
    let (calls, hooks) = (Seen::default(), Seen::default());
    let up = upstream(
        axum::Router::new()
            .route("/v1/call", post(count).with_state(calls.clone()))
            .route("/v1/render", post(count).with_state(calls.clone()))
            .route("/v1/slow", post(count).with_state(calls.clone()))
            .route(
                "/internal/events",
                post(delivered).with_state(hooks.clone()),
            )
            .route("/mcp", post(mcp_server).with_state(calls.clone())),
    )
    .await;
    let cfg = config(dir, store, up);
    let gw = Gateway::start(
        &["--config", &cfg],
        &[
            ("TEST_WEBHOOK_SECRET", SECRET),
            ("TEST_ADMIN_TOKEN", TOKEN),
            // Queued jobs on PostgreSQL are encrypted with a key kept outside it.
            (
                "ONCELY_SECRET_KEY",
                "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
            ),
        ],
    );
    (gw, calls, hooks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_postgres_answers_every_entry_point_within_the_bound() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (gw, calls, hooks) = serve(&pg.url, dir.path()).await;
    let b = before(&gw).await;
    // The running job is under way when the server freezes.
    eventually("the running job starts", Duration::from_secs(10), || {
        calls.of("\"running\"") == 1
    })
    .await;

    pg.pause();
    let paused = Instant::now();
    let dark = tokio::time::timeout(Duration::from_secs(60), in_the_dark(&gw, &pg.url, &b)).await;
    // The pause outlasts the bound, so every answer above came from it, not the server.
    tokio::time::sleep((BOUND + SLACK).saturating_sub(paused.elapsed())).await;
    nothing_ran_in_the_dark(&calls, &hooks);
    pg.resume();
    let dark = dark.expect("an entry point hung on the paused ledger");
    assert_bounded(&dark);
    after(&gw, &calls, &hooks, &b).await;
}

/// An upstream that does not answer within the route's `timeout` while the ledger is
/// dark: the owner cannot record `outcome_unknown`, and its caller still gets its 504
/// within the timeout and one bound, not when the ledger comes back; the write lands
/// after, and a repeat is refused as unknown, never sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_timeout_is_answered_within_the_bound_while_postgres_is_paused() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (gw, calls, _hooks) = serve(&pg.url, dir.path()).await;
    let warm = http_post(&gw.url("/v1/call"), "warm", &[ALICE]).await;
    assert_eq!(warm.status, 200, "{}", warm.text());

    let body = render("slow", 30_000);
    let started = Instant::now();
    let call = tokio::spawn({
        let url = gw.url("/v1/slow");
        let body = body.clone();
        async move { http_post(&url, &body, &[ALICE]).await }
    });
    eventually("the slow call is sent", Duration::from_secs(10), || {
        calls.of("\"slow\"") == 1
    })
    .await;
    // The ledger goes dark before the route's 2 s timeout, and stays dark well past
    // the timeout and one bound.
    pg.pause();
    let timeout = Duration::from_secs(2);
    let answered = tokio::time::timeout(timeout + BOUND + SLACK + SLACK, call).await;
    let took = started.elapsed();
    tokio::time::sleep((timeout + BOUND + SLACK + SLACK).saturating_sub(started.elapsed())).await;
    pg.resume();
    let answer = answered
        .expect("the failed call waited for the ledger to come back")
        .unwrap();
    eprintln!(
        "the timed-out call answered {} after {took:?}",
        answer.status
    );
    assert!(took < timeout + BOUND + SLACK, "answered after {took:?}");
    assert_eq!(answer.status, 504, "{}", answer.text());
    assert_eq!(
        answer.json()["code"],
        "upstream_timeout",
        "{}",
        answer.text()
    );

    // The owner's write lands once the ledger is back: a repeat is refused as unknown.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let again = http_post(&gw.url("/v1/slow"), &body, &[ALICE]).await;
        if again.status == 409 {
            assert_eq!(again.json()["code"], "outcome_unknown", "{}", again.text());
            break;
        }
        assert!(
            Instant::now() < until,
            "the repeat got {}: {}",
            again.status,
            again.text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(calls.of("\"slow\""), 1, "the unknown call was sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_locked_sqlite_ledger_answers_every_entry_point_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let store = format!("sqlite://{}", db.display());
    let (gw, calls, hooks) = serve(&store, dir.path()).await;
    let b = before(&gw).await;
    eventually("the running job starts", Duration::from_secs(10), || {
        calls.of("\"running\"") == 1
    })
    .await;

    // Another process takes the write lock and keeps it past the bound.
    let mut locker = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys,time\n\
             c=sqlite3.connect(sys.argv[1],isolation_level=None,timeout=30)\n\
             c.execute('BEGIN IMMEDIATE')\nprint('locked',flush=True)\n\
             time.sleep(float(sys.argv[2]))\nc.execute('COMMIT')",
            db.to_str().unwrap(),
            &(BOUND + SLACK + Duration::from_secs(2))
                .as_secs()
                .to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(locker.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "locked");

    let dark = tokio::time::timeout(Duration::from_secs(60), in_the_dark(&gw, &store, &b)).await;
    nothing_ran_in_the_dark(&calls, &hooks);
    tokio::task::spawn_blocking(move || locker.wait().unwrap())
        .await
        .unwrap();
    let dark = dark.expect("an entry point hung on the locked ledger");
    // On SQLite the reads go on under a write lock: a job's status, the admin list and
    // the console answer as usual; what needs a write (the CLI opens the ledger for
    // writing) answers within the bound.
    let (reads, writes): (Vec<Dark>, Vec<Dark>) = dark.into_iter().partition(|d| {
        matches!(
            d.what,
            "job status" | "admin GET /records" | "console /console/inflight"
        )
    });
    for r in &reads {
        assert!(r.took < BOUND + SLACK, "{} took {:?}", r.what, r.took);
        assert_eq!(r.status, 200, "{}: {}", r.what, r.body);
    }
    assert_bounded(&writes);
    after(&gw, &calls, &hooks, &b).await;
}
