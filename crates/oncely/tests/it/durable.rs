//! What a dead gateway held is taken up again within about one `lease`, through the real
//! binary: the worker renews its task leases while the work runs (like record leases), so
//! they can be short. A job cut off by a SIGKILL runs again (same downstream key) and
//! frees its route's `concurrency` slot for the queued job behind it; a webhook delivery
//! cut off mid-flight is sent again; on PostgreSQL another instance takes the work up.
//! Before, a job waited `timeout + 2 x lease` and a delivery a fixed 120 s.
//!
//! And the other way round: a forward step of the wall clock (libfaketime) larger than
//! the lease takes nothing from a live owner on SQLite (leases are measured on the
//! monotonic clock).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use http::HeaderMap;

use crate::common::{get, post as http_post, upstream, Answer, Gateway};

/// Every execution an upstream saw: (its text or event id, its `Idempotency-Key`, when).
#[derive(Clone, Default)]
pub(crate) struct Seen(Arc<Mutex<Vec<(String, String, Instant)>>>);

impl Seen {
    pub(crate) fn of(&self, text: &str) -> Vec<(String, Instant)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _, _)| t == text)
            .map(|(_, k, at)| (k.clone(), *at))
            .collect()
    }

    /// Waits until `text` was executed `n` times; gives up after `limit`.
    pub(crate) async fn until(
        &self,
        text: &str,
        n: usize,
        limit: Duration,
    ) -> Vec<(String, Instant)> {
        let start = Instant::now();
        loop {
            let got = self.of(text);
            if got.len() >= n || start.elapsed() > limit {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Records one execution; `true` when it is the first of `text`.
    fn note(&self, text: &str, headers: &HeaderMap) -> bool {
        let key = headers
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let mut seen = self.0.lock().unwrap();
        let first = !seen.iter().any(|(t, _, _)| t == text);
        seen.push((text.to_owned(), key, Instant::now()));
        first
    }
}

/// `POST /v1/render` with `{"text": T}`: the first execution of a T that starts with
/// `cut` hangs for a minute (it is cut off by the crash), a T that starts with `slow`
/// takes 4 s; everything else answers 201 at once. `POST /internal/events`: the same per
/// event id.
pub(crate) fn service(seen: Seen) -> axum::Router {
    async fn hang_first(seen: &Seen, text: &str, headers: &HeaderMap) {
        if seen.note(text, headers) && text.starts_with("cut") {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        if text.starts_with("slow") {
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
    }
    axum::Router::new()
        .route(
            "/v1/render",
            post(
                |State(seen): State<Seen>, headers: HeaderMap, body: String| async move {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let text = v["text"].as_str().unwrap().to_owned();
                    hang_first(&seen, &text, &headers).await;
                    (
                        http::StatusCode::CREATED,
                        [("content-type", "application/json")],
                        format!("{{\"audio\":\"{text}.mp3\"}}"),
                    )
                },
            ),
        )
        .route(
            "/internal/events",
            post(
                |State(seen): State<Seen>, headers: HeaderMap, body: String| async move {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let id = v["id"].as_str().unwrap().to_owned();
                    hang_first(&seen, &id, &headers).await;
                    http::StatusCode::OK
                },
            ),
        )
        .with_state(seen)
}

const ALICE: (&str, &str) = ("authorization", "Bearer sk_alice");
/// The routes' `lease`, and what "about one lease" may take on a loaded test machine.
const LEASE: Duration = Duration::from_secs(1);
const TAKEN_UP_WITHIN: Duration = Duration::from_secs(6);
const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A job route with a long `timeout` (60s) and a short `lease` (1s), one job at a time,
/// and a webhook endpoint with the same lease.
pub(crate) fn config(dir: &std::path::Path, store: &str, up: std::net::SocketAddr) -> String {
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
wait = "500ms"
timeout = "60s"
lease = "1s"
concurrency = 1

[[webhooks]]
path = "/hooks/events"
verify = "standard"
secret_env = "TEST_WEBHOOK_SECRET"
deliver_to = "http://{up}/internal/events"
deliver_timeout = "60s"
lease = "1s"
"#
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_owned()
}

/// `oncely serve --config CFG`; every instance seals queued jobs with the same key (a
/// PostgreSQL ledger with a job route refuses to start without one).
pub(crate) fn start(cfg: &str) -> Gateway {
    Gateway::start(
        &["--config", cfg],
        &[
            ("TEST_WEBHOOK_SECRET", WEBHOOK_SECRET),
            (
                "ONCELY_SECRET_KEY",
                "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
            ),
        ],
    )
}

async fn render(gw: &Gateway, text: &str) -> Answer {
    http_post(
        &gw.url("/v1/render"),
        &format!(r#"{{"text":"{text}"}}"#),
        &[ALICE, ("content-type", "application/json")],
    )
    .await
}

/// Polls a job's status until it is no longer running (or `limit` passes).
async fn until_done(gw: &Gateway, location: &str, limit: Duration) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let v = get(&gw.url(location), &[ALICE]).await.json();
        if v["status"] != "running" || start.elapsed() > limit {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Submits job A (whose first run hangs) and job B (queued behind it, concurrency 1),
/// and waits until A runs. Returns their status paths.
async fn a_running_b_queued(gw: &Gateway, seen: &Seen) -> (String, String) {
    let a = render(gw, "cut-a").await;
    assert_eq!(a.status, 202, "{}", a.text());
    let b = render(gw, "job-b").await;
    assert_eq!(b.status, 202, "{}", b.text());
    assert_eq!(
        seen.until("cut-a", 1, Duration::from_secs(5)).await.len(),
        1
    );
    assert!(seen.of("job-b").is_empty(), "B waits for A's slot");
    (
        a.header("location").to_owned(),
        b.header("location").to_owned(),
    )
}

/// After the crash, A runs again (same downstream key) and B runs once, both within
/// about one lease of `since`, and both complete.
async fn a_and_b_are_taken_up(gw: &Gateway, seen: &Seen, jobs: &(String, String), since: Instant) {
    let a_runs = seen.until("cut-a", 2, Duration::from_secs(20)).await;
    assert_eq!(a_runs.len(), 2, "the cut-off job runs again");
    assert_eq!(a_runs[0].0, a_runs[1].0, "with the same downstream key");
    let waited = a_runs[1].1.duration_since(since);
    assert!(
        waited < TAKEN_UP_WITHIN,
        "the dead run's job was taken up after {waited:?} (lease {LEASE:?})"
    );
    for location in [&jobs.0, &jobs.1] {
        let done = until_done(gw, location, Duration::from_secs(10)).await;
        assert_eq!(done["status"], "completed", "{done}");
    }
    let b_runs = seen.until("job-b", 1, Duration::from_secs(1)).await;
    assert_eq!(b_runs.len(), 1, "the queued job ran once");
    let b_waited = b_runs[0].1.duration_since(since);
    assert!(
        b_waited < TAKEN_UP_WITHIN,
        "the queued job got the dead run's slot after {b_waited:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen.of("cut-a").len(), 2, "A ran exactly twice");
    assert_eq!(seen.of("job-b").len(), 1, "B ran exactly once");
    let status = get(&gw.url(&jobs.0), &[ALICE]).await.json();
    assert_eq!(status["attempt"], 2, "{status}");
}

/// SQLite: SIGKILL while job A runs and job B waits for its slot; after a restart both
/// are taken up within about one lease (before: `timeout + 2 x lease`, 62 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateways_job_and_its_slot_are_taken_up_within_a_lease() {
    let seen = Seen::default();
    let up = upstream(service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = config(dir.path(), &store, up);
    let gw = start(&cfg);
    let jobs = a_running_b_queued(&gw, &seen).await;
    drop(gw); // SIGKILL
    let restarted = Instant::now();
    let gw = start(&cfg);
    a_and_b_are_taken_up(&gw, &seen, &jobs, restarted).await;
}

/// PostgreSQL, two instances: the one running job A (and holding B's slot) is killed;
/// the other takes both up within about one lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_takes_up_a_killed_instances_job_within_a_lease() {
    let store = crate::cluster::fresh_schema(&crate::cluster::shared_url()).await;
    let seen = Seen::default();
    let up = upstream(service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &store, up);
    let doomed = start(&cfg);
    let jobs = a_running_b_queued(&doomed, &seen).await;
    let heir = start(&cfg);
    drop(doomed); // SIGKILL
    let killed = Instant::now();
    a_and_b_are_taken_up(&heir, &seen, &jobs, killed).await;
}

pub(crate) fn signed(event_id: &str, body: &str) -> Vec<(String, String)> {
    let scheme: oncely_webhooks::Scheme = "standard".parse().unwrap();
    let secrets = oncely_webhooks::Secrets::parse(&scheme, WEBHOOK_SECRET).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    oncely_webhooks::sign(&scheme, secrets.primary(), event_id, now, body.as_bytes())
}

/// A delivery cut off mid-flight by a SIGKILL is sent again within about one lease of
/// the restart (before: the fixed 120 s task lease), with the same key, and only once.
async fn a_cut_off_delivery_is_sent_again(
    store_of: impl Fn(&std::path::Path) -> String,
    two: bool,
) {
    let seen = Seen::default();
    let up = upstream(service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &store_of(dir.path()), up);
    let gw = start(&cfg);
    let body = r#"{"type":"invoice.paid","id":"cut_evt"}"#;
    let mut headers: HashMap<String, String> = signed("msg_crash", body).into_iter().collect();
    headers.insert("content-type".into(), "application/json".into());
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let ack = http_post(&gw.url("/hooks/events"), body, &h).await;
    assert_eq!(ack.status, 200, "{}", ack.text());
    assert_eq!(
        seen.until("cut_evt", 1, Duration::from_secs(5)).await.len(),
        1
    );
    let other = two.then(|| start(&cfg));
    drop(gw); // SIGKILL mid-delivery
    let killed = Instant::now();
    let _gw = other.unwrap_or_else(|| start(&cfg));
    let got = seen.until("cut_evt", 2, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 2, "the cut-off delivery is sent again");
    assert_eq!(got[1].0, "msg_crash", "with the event id as its key");
    let waited = got[1].1.duration_since(killed);
    assert!(
        waited < TAKEN_UP_WITHIN,
        "the delivery was sent again after {waited:?} (lease {LEASE:?})"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(seen.of("cut_evt").len(), 2, "and not a third time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_cut_off_by_a_sigkill_is_sent_again_within_a_lease() {
    a_cut_off_delivery_is_sent_again(
        |dir| format!("sqlite://{}", dir.join("ledger.db").display()),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_sends_a_killed_instances_delivery_within_a_lease() {
    let store = crate::cluster::fresh_schema(&crate::cluster::shared_url()).await;
    a_cut_off_delivery_is_sent_again(|_| store.clone(), true).await;
}

/// libfaketime, from the Debian package `faketime` (`scripts/test` installs it).
fn libfaketime() -> String {
    let found = ["x86_64-linux-gnu", "aarch64-linux-gnu", ""]
        .iter()
        .map(|arch| format!("/usr/lib/{arch}/faketime/libfaketime.so.1").replace("//", "/"))
        .find(|p| std::path::Path::new(p).exists());
    found.expect("libfaketime not found: apt-get install faketime (scripts/test does)")
}

/// A forward step of the system clock larger than the lease (one hour, lease 2s) while
/// an owner's call runs on SQLite: a duplicate that arrives right after the step does
/// not take the live owner's record over, and the upstream executes once. The binary
/// runs under libfaketime with its wall clock read from a file the test rewrites; the
/// monotonic clock is left alone, as a real clock step (NTP, an operator) leaves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_clock_step_does_not_let_a_live_owner_be_taken_over() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = calls.clone();
    let up = upstream(axum::Router::new().route(
        "/v1/charge",
        post(move || {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                format!("charge #{n}")
            }
        }),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock");
    std::fs::write(&clock, "+0\n").unwrap();
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = "sqlite://{db}"
upstream = "http://{up}"
[[routes]]
method = "POST"
path = "/v1/charge"
class = "write"
timeout = "20s"
lease = "2s"
wait = "10s"
"#,
            db = dir.path().join("ledger.db").display()
        ),
    )
    .unwrap();
    let gw = under_faketime(cfg.to_str().unwrap(), &clock);
    let gw = Arc::new(gw);
    let headers = [ALICE, ("idempotency-key", "charge-1")];
    let first = {
        let gw = gw.clone();
        tokio::spawn(async move { http_post(&gw.url("/v1/charge"), "{}", &headers).await })
    };
    let start = Instant::now();
    while calls.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Well inside the first renewal period: the lease is live when the clock jumps.
    std::fs::write(&clock, "+1h\n").unwrap();
    let dup = http_post(&gw.url("/v1/charge"), "{}", &headers).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.text(), "charge #1");
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(
        dup.text(),
        "charge #1",
        "the duplicate got the first answer"
    );
    assert_eq!(dup.header("oncely-status"), "joined");
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the live owner was not taken over"
    );
}

/// `oncely serve --config CFG` with its wall clock read from the file `clock`
/// (libfaketime; the monotonic clock is left alone).
fn under_faketime(cfg: &str, clock: &std::path::Path) -> Gateway {
    Gateway::start(
        &["--config", cfg],
        &[
            ("LD_PRELOAD", libfaketime().as_str()),
            ("FAKETIME_TIMESTAMP_FILE", clock.to_str().unwrap()),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ("TEST_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ],
    )
}

/// The same step while a queued job runs on SQLite (route lease 1s): its task is not
/// leased again and its record not taken over, so the job runs once and completes at
/// attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_clock_step_does_not_run_a_live_job_again() {
    let seen = Seen::default();
    let up = upstream(service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock");
    std::fs::write(&clock, "+0\n").unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = config(dir.path(), &store, up);
    let gw = under_faketime(&cfg, &clock);
    let job = render(&gw, "slow-job").await;
    assert_eq!(job.status, 202, "{}", job.text());
    assert_eq!(
        seen.until("slow-job", 1, Duration::from_secs(5))
            .await
            .len(),
        1
    );
    std::fs::write(&clock, "+1h\n").unwrap();
    let done = until_done(&gw, job.header("location"), Duration::from_secs(15)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["attempt"], 1, "{done}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(seen.of("slow-job").len(), 1, "the live job ran once");
}
