//! Jobs through the real binary: a `job` route's first request waits up to `wait`, then
//! gets 202 and a job id; the gateway owns the call (a client that goes away cancels
//! nothing), a duplicate gets the same job, the status is only for the principal that
//! started it, and a queued job survives a SIGKILL of the gateway.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use http::HeaderMap;

use crate::common::{get, post as http_post, upstream, Answer, Gateway};

/// Every execution the render service saw: its downstream key and body, whether it
/// finished, and the most executions it ran at once.
#[derive(Clone, Default)]
struct Renders {
    started: Arc<Mutex<Vec<(String, String)>>>,
    finished: Arc<Mutex<Vec<String>>>,
    failed_once: Arc<Mutex<HashSet<String>>>,
    running: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
}

impl Renders {
    fn started_with(&self, needle: &str) -> Vec<String> {
        let started = self.started.lock().unwrap();
        started
            .iter()
            .filter(|(_, body)| body.contains(needle))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn finished_with(&self, needle: &str) -> usize {
        let finished = self.finished.lock().unwrap();
        finished.iter().filter(|b| b.contains(needle)).count()
    }
}

/// `POST /v1/render` with `{"ms": N, "text": T}`: works N ms, answers 201 with
/// `X-Request-Id: prov-T`. With `"fail_first": true` its first execution of T answers
/// 503 instead.
fn render_service(renders: Renders) -> axum::Router {
    axum::Router::new()
        .route(
            "/v1/render",
            post(
                |State(r): State<Renders>, headers: HeaderMap, body: String| async move {
                    let key = headers
                        .get("idempotency-key")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    r.started.lock().unwrap().push((key, body.clone()));
                    let now = r.running.fetch_add(1, Ordering::SeqCst) + 1;
                    r.most_at_once.fetch_max(now, Ordering::SeqCst);
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let text = v["text"].as_str().unwrap().to_owned();
                    tokio::time::sleep(Duration::from_millis(v["ms"].as_u64().unwrap())).await;
                    r.running.fetch_sub(1, Ordering::SeqCst);
                    r.finished.lock().unwrap().push(body.clone());
                    let fail = v["fail_first"] == true
                        && r.failed_once.lock().unwrap().insert(text.clone());
                    let status = if fail {
                        http::StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        http::StatusCode::CREATED
                    };
                    (
                        status,
                        [
                            ("content-type", "application/json".to_owned()),
                            ("x-request-id", format!("prov-{text}")),
                        ],
                        format!("{{\"audio\":\"{text}.mp3\"}}"),
                    )
                },
            ),
        )
        .with_state(renders)
}

/// The store: a SQLite file, or `$JOBS_TEST_STORE` (e.g. `memory:`).
fn config(dir: &std::path::Path, up: std::net::SocketAddr, timeout: &str, extra: &str) -> String {
    let store = std::env::var("JOBS_TEST_STORE")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.join("ledger.db").display()));
    config_on(dir, &store, up, timeout, extra)
}

/// The config of the render job route on `store`.
fn config_on(
    dir: &std::path::Path,
    store: &str,
    up: std::net::SocketAddr,
    timeout: &str,
    extra: &str,
) -> String {
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
wait = "1s"
timeout = "{timeout}"
lease = "1s"
{extra}
"#
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_owned()
}

const ALICE: (&str, &str) = ("authorization", "Bearer sk_alice");
const MALLORY: (&str, &str) = ("authorization", "Bearer sk_mallory");

async fn render(gw: &Gateway, body: &str) -> Answer {
    http_post(
        &gw.url("/v1/render"),
        body,
        &[ALICE, ("content-type", "application/json")],
    )
    .await
}

/// Polls the job's status as Alice until it is no longer running.
async fn until_done(gw: &Gateway, location: &str, limit: Duration) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let s = get(&gw.url(location), &[ALICE]).await;
        assert_eq!(s.status, 200, "{}", s.text());
        let v = s.json();
        if v["status"] != "running" || start.elapsed() > limit {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_job_answers_at_once_and_a_slow_one_gets_202_then_its_result() {
    let renders = Renders::default();
    let up = upstream(render_service(renders.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&["--config", &config(dir.path(), up, "20s", "")], &[]);

    let fast = render(&gw, r#"{"ms":10,"text":"fast"}"#).await;
    assert_eq!(fast.status, 201, "{}", fast.text());
    assert_eq!(fast.header("oncely-status"), "fresh");
    assert_eq!(fast.json()["audio"], "fast.mp3");

    let slow = render(&gw, r#"{"ms":2500,"text":"slow"}"#).await;
    assert_eq!(slow.status, 202, "{}", slow.text());
    assert_eq!(slow.header("oncely-status"), "fresh");
    let job = slow.json();
    let id = job["job_id"].as_str().unwrap().to_owned();
    let location = slow.header("location").to_owned();
    assert_eq!(location, format!("/_oncely/jobs/{id}"));
    assert_eq!(job["status"], "running");
    assert_eq!(job["status_url"], location.as_str());
    assert!(job["started_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(slow.header("oncely-record"), id);

    // Only Alice may see it; anyone else (or nobody) gets 404, as for an unknown id.
    let status = get(&gw.url(&location), &[ALICE]).await;
    assert_eq!(status.status, 200);
    assert_eq!(status.json()["status"], "running");
    for who in [vec![MALLORY], vec![]] {
        let other = get(&gw.url(&location), &who).await;
        assert_eq!(other.status, 404, "{}", other.text());
        assert_eq!(other.json()["code"], "not_found");
        let other = get(&gw.url(&format!("{location}/result")), &who).await;
        assert_eq!(other.status, 404);
    }
    let unknown = get(&gw.url("/_oncely/jobs/rec_nope"), &[ALICE]).await;
    assert_eq!(unknown.status, 404);
    let early = get(&gw.url(&format!("{location}/result")), &[ALICE]).await;
    assert_eq!(early.status, 409);
    assert_eq!(early.json()["code"], "in_flight");

    let done = until_done(&gw, &location, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["upstream_status"], 201);
    let result = get(&gw.url(&format!("{location}/result")), &[ALICE]).await;
    assert_eq!(result.status, 201);
    assert_eq!(result.header("oncely-status"), "replayed");
    assert_eq!(result.json()["audio"], "slow.mp3");
    let again = render(&gw, r#"{"ms":2500,"text":"slow"}"#).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("oncely-status"), "replayed");
    assert_eq!(again.header("oncely-record"), id);
    assert_eq!(renders.started_with("slow").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_outlives_its_client() {
    let renders = Renders::default();
    let up = upstream(render_service(renders.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&["--config", &config(dir.path(), up, "20s", "")], &[]);
    // The client gives up after 300ms, long before the job's first `wait` ends.
    let gone = tokio::time::timeout(
        Duration::from_millis(300),
        render(&gw, r#"{"ms":1500,"text":"orphan"}"#),
    )
    .await;
    assert!(gone.is_err(), "the client went away first");
    let start = Instant::now();
    while renders.finished_with("orphan") == 0 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        renders.finished_with("orphan"),
        1,
        "the call ran to its end"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = render(&gw, r#"{"ms":1500,"text":"orphan"}"#).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(retry.header("oncely-status"), "replayed");
    assert_eq!(retry.json()["audio"], "orphan.mp3");
    assert_eq!(renders.started_with("orphan").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_duplicates_of_a_running_job_execute_it_once() {
    let renders = Renders::default();
    let up = upstream(render_service(renders.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Arc::new(Gateway::start(
        &["--config", &config(dir.path(), up, "20s", "")],
        &[],
    ));
    let first = render(&gw, r#"{"ms":3000,"text":"dup"}"#).await;
    assert_eq!(first.status, 202);
    let id = first.json()["job_id"].as_str().unwrap().to_owned();
    let mut all = Vec::new();
    for _ in 0..20 {
        let gw = gw.clone();
        all.push(tokio::spawn(async move {
            render(&gw, r#"{"ms":3000,"text":"dup"}"#).await
        }));
    }
    for d in all {
        let d = d.await.unwrap();
        assert_eq!(d.status, 202, "{}", d.text());
        assert_eq!(d.header("oncely-status"), "joined");
        assert_eq!(d.json()["job_id"], id.as_str(), "the same job");
    }
    let done = until_done(&gw, &format!("/_oncely/jobs/{id}"), Duration::from_secs(10)).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(renders.started_with("dup").len(), 1, "one execution");
}

/// Concurrency 1: job A runs, job B waits in the queue. The gateway is killed (SIGKILL)
/// and started again on the same SQLite file: B runs exactly once, and A, whose owner
/// died mid-call, runs again with the same downstream key (jobs are write-like).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_survives_a_sigkill_of_the_gateway() {
    let renders = Renders::default();
    let up = upstream(render_service(renders.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), up, "6s", "concurrency = 1");
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let a = render(&gw, r#"{"ms":4000,"text":"job-a"}"#).await;
    assert_eq!(a.status, 202, "{}", a.text());
    let b = render(&gw, r#"{"ms":100,"text":"job-b"}"#).await;
    assert_eq!(b.status, 202, "B waits behind A: {}", b.text());
    assert!(
        renders.started_with("job-b").is_empty(),
        "B is queued, not running"
    );
    drop(gw); // SIGKILL
    assert_eq!(renders.finished_with("job-a"), 0, "A was cut off mid-call");

    let gw = Gateway::start(&["--config", &cfg], &[]);
    for job in [&a, &b] {
        let location = job.header("location").to_owned();
        let done = until_done(&gw, &location, Duration::from_secs(20)).await;
        assert_eq!(done["status"], "completed", "{done}");
    }
    let b_runs = renders.started_with("job-b");
    assert_eq!(b_runs.len(), 1, "the queued job ran exactly once");
    let a_runs = renders.started_with("job-a");
    assert_eq!(a_runs.len(), 2, "A ran again after its owner died");
    assert_eq!(a_runs[0], a_runs[1], "with the same downstream key");
    let status = get(&gw.url(a.header("location")), &[ALICE]).await.json();
    assert_eq!(status["attempt"], 2);
    let result = get(
        &gw.url(&format!("{}/result", b.header("location"))),
        &[ALICE],
    )
    .await;
    assert_eq!(result.json()["audio"], "job-b.mp3");
}

/// The gateway's JSON log lines of target `oncely::request` with this message.
fn log_lines(gw: &Gateway, message: &str) -> Vec<serde_json::Value> {
    gw.lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "oncely::request" && v["message"] == message)
        .collect()
}

/// A job whose upstream failed (503: released) is retried by sending it again. The retry
/// is queued like any job: at concurrency 1 behind a running job it gets 202 and waits,
/// then runs with the same downstream key (attempt 2). Each run the worker ends is logged
/// with the request line's fields and the job's status, and counted in
/// `oncely_requests_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_is_retried_through_the_queue_and_each_run_is_logged() {
    let renders = Renders::default();
    let up = upstream(render_service(renders.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), up, "20s", "concurrency = 1");
    let gw = Gateway::start(&["--config", &cfg, "--log-format", "json"], &[]);
    let flaky = r#"{"ms":10,"text":"flaky","fail_first":true}"#;

    let failed = render(&gw, flaky).await;
    assert_eq!(failed.status, 503, "{}", failed.text());
    assert_eq!(failed.header("oncely-status"), "fresh");
    let id = failed.header("oncely-record").to_owned();
    let location = format!("/_oncely/jobs/{id}");
    let status = until_done(&gw, &location, Duration::from_secs(5)).await;
    assert_eq!(status["status"], "failed", "{status}");

    let busy = render(&gw, r#"{"ms":2500,"text":"busy"}"#).await;
    assert_eq!(busy.status, 202, "{}", busy.text());
    let retry = render(&gw, flaky).await;
    assert_eq!(
        retry.status,
        202,
        "the retry waits behind the busy job: {}",
        retry.text()
    );
    assert_eq!(retry.header("oncely-status"), "fresh");
    assert_eq!(retry.json()["job_id"], id.as_str(), "the same job");
    assert_eq!(
        renders.started_with("flaky").len(),
        1,
        "the retry is queued, not run at once"
    );

    let done = until_done(&gw, &location, Duration::from_secs(15)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["attempt"], 2);
    let busy_done = until_done(&gw, busy.header("location"), Duration::from_secs(5)).await;
    assert_eq!(busy_done["status"], "completed");
    assert_eq!(
        renders.most_at_once.load(Ordering::SeqCst),
        1,
        "concurrency 1 held for the retry too"
    );
    let keys = renders.started_with("flaky");
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "the same downstream key");
    let result = get(&gw.url(&format!("{location}/result")), &[ALICE]).await;
    assert_eq!(result.status, 201);
    assert_eq!(result.json()["audio"], "flaky.mp3");

    tokio::time::sleep(Duration::from_millis(300)).await;
    let runs = log_lines(&gw, "job finished");
    assert_eq!(runs.len(), 3, "{runs:#?}");
    let flaky_runs: Vec<_> = runs.iter().filter(|l| l["record"] == id.as_str()).collect();
    assert_eq!(flaky_runs.len(), 2, "{runs:#?}");
    let (first, second) = (flaky_runs[0], flaky_runs[1]);
    assert_eq!(first["status"], "failed", "{first}");
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["upstream_status"], 503);
    assert_eq!(second["status"], "completed", "{second}");
    assert_eq!(second["attempt"], 2);
    assert_eq!(second["upstream_status"], 201);
    assert_eq!(second["provider_request_id"], "prov-flaky");
    assert_eq!(second["route"], "POST /v1/render");
    assert!(second["duration_ms"].is_number(), "{second}");
    let principal = second["principal"].as_str().unwrap();
    assert_eq!(principal.len(), 64, "a keyed hash: {principal}");
    // The requests have their own lines: the first, the busy job's, the retry.
    let requests = log_lines(&gw, "guarded request");
    let statuses: Vec<_> = requests.iter().map(|l| l["status"].clone()).collect();
    assert_eq!(statuses, ["fresh", "fresh", "fresh"], "{requests:#?}");

    let metrics = get(&gw.admin_url("/metrics"), &[]).await.text();
    let count = |status: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("oncely_requests_total{")
                    && l.contains("route=\"POST /v1/render\"")
                    && l.contains(&format!("status=\"{status}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(count("completed"), 2, "{metrics}");
    assert_eq!(count("failed"), 1, "{metrics}");
    assert_eq!(count("fresh"), 3, "{metrics}");
}

/// PostgreSQL: two `oncely serve` processes on one database are one gateway for jobs
/// too. With the route at `concurrency = 1`, 4 distinct jobs submitted across both
/// instances at once run one at a time in total (the upstream never sees two at once),
/// each exactly once, and either instance answers any job's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_jobs_over_two_instances_on_postgres_run_one_at_a_time() {
    let store = crate::cluster::fresh_schema(&crate::cluster::shared_url()).await;
    let renders = Renders::default();
    let up = upstream(render_service(renders.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_on(dir.path(), &store, up, "20s", "concurrency = 1");
    // Every instance seals and opens jobs with the same key.
    let key = [(
        "ONCELY_SECRET_KEY",
        "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
    )];
    let gws = Arc::new([
        Gateway::start(&["--config", &cfg, "--log-format", "json"], &key),
        Gateway::start(&["--config", &cfg, "--log-format", "json"], &key),
    ]);
    let submitted: Vec<_> = (0..4)
        .map(|i| {
            let gws = gws.clone();
            tokio::spawn(async move {
                let body = format!(r#"{{"ms":700,"text":"pg-job-{i}"}}"#);
                render(&gws[i % 2], &body).await
            })
        })
        .collect();
    let mut locations = Vec::new();
    for s in submitted {
        let answer = s.await.unwrap();
        // One may finish within `wait` (1s) and answer at once; the others are queued.
        match answer.status.as_u16() {
            202 => locations.push(answer.header("location").to_owned()),
            201 => locations.push(format!("/_oncely/jobs/{}", answer.header("oncely-record"))),
            other => panic!("unexpected {other}: {}", answer.text()),
        }
    }
    for (n, location) in locations.iter().enumerate() {
        let done = until_done(&gws[(n + 1) % 2], location, Duration::from_secs(30)).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(done["attempt"], 1, "{done}");
    }
    for i in 0..4 {
        assert_eq!(
            renders.started_with(&format!("pg-job-{i}")).len(),
            1,
            "job {i} ran exactly once"
        );
    }
    assert_eq!(renders.started.lock().unwrap().len(), 4);
    assert_eq!(
        renders.most_at_once.load(Ordering::SeqCst),
        1,
        "concurrency 1 across both instances"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runs: usize = gws.iter().map(|g| log_lines(g, "job finished").len()).sum();
    assert_eq!(runs, 4, "one finished run logged per job");
}
