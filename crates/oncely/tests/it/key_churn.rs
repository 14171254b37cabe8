//! Keys made up for each attempt, through the real binary: a retry under a new
//! `Idempotency-Key` is the original's when the original's caller went away before its
//! answer (it joins it running, or gets its stored answer, with `Oncely-Key-Churn`), and
//! its key names the original from then on; identical requests whose callers all waited,
//! or that come after an answer reached its caller, stay two; `churn_window = "0s"` turns
//! it off; two instances on one PostgreSQL agree.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use crate::common::{get, post, run, stdout, upstream, Answer, Gateway};

const AUTH: (&str, &str) = ("authorization", "Bearer sk_churn");
const BODY: &str = r#"{"sku": "render-90s", "qty": 1}"#;

/// An upstream whose `POST /v1/orders` takes `delay` and counts its executions.
async fn orders(delay: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let router = axum::Router::new().route(
        "/v1/orders",
        axum::routing::post(move |body: String| {
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                tokio::time::sleep(delay).await;
                format!("order #{n}: {body}")
            }
        }),
    );
    (upstream(router).await, calls)
}

fn config(dir: &std::path::Path, up: SocketAddr, store: &str, extra: &str) -> String {
    let cfg = dir.join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            "store = \"{store}\"\nupstream = \"http://{up}\"\n[[routes]]\nmethod = \"POST\"\n\
             path = \"/v1/orders\"\nclass = \"action\"\ntimeout = \"30s\"\n{extra}"
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_owned()
}

fn sqlite_gateway(up: SocketAddr, extra: &str) -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = config(dir.path(), up, &store, extra);
    (Gateway::start(&["--config", &cfg], &[]), dir)
}

/// Sends the order under `key` on a connection of its own and closes it after `after`,
/// without reading the answer: a caller whose timeout ran out.
async fn give_up(addr: SocketAddr, key: &str, after: Duration) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/orders HTTP/1.1\r\nhost: {addr}\r\nauthorization: {}\r\n\
         idempotency-key: {key}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{BODY}",
        AUTH.1,
        BODY.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    drop(conn);
}

async fn order(gw: &Gateway, key: &str, body: &str) -> Answer {
    post(
        &gw.url("/v1/orders"),
        body,
        &[
            AUTH,
            ("idempotency-key", key),
            ("content-type", "application/json"),
        ],
    )
    .await
}

/// Waits (10 s at most) until the upstream has seen `n` executions.
async fn reached(calls: &AtomicUsize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < deadline, "the upstream never saw {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gave_up_and_retried_with_a_new_key_joins_the_running_original() {
    let (up, calls) = orders(Duration::from_secs(3)).await;
    let (gw, _dir) = sqlite_gateway(up, "");
    give_up(gw.addr, "attempt-1", Duration::from_secs(1)).await;
    // A retry loop's backoff (the OpenAI and Anthropic SDKs wait 0.5 s and more): a retry
    // sent the instant the connection closed may come before the gateway has read that
    // it closed, on a loaded machine, and is then a second order.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = order(&gw, "attempt-2", BODY).await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(retry.header("oncely-status"), "joined", "{}", retry.text());
    assert_eq!(retry.header("idempotent-replayed"), "true");
    assert_eq!(retry.text(), format!("order #1: {BODY}"));
    let original = retry.header("oncely-record").to_owned();
    assert_eq!(retry.header("oncely-key-churn"), original);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one execution");

    // The made-up key names the original from then on: its repeat replays it, and the
    // key with another body is refused.
    let again = order(&gw, "attempt-2", BODY).await;
    assert_eq!(
        again.header("oncely-status"),
        "replayed",
        "{}",
        again.text()
    );
    assert_eq!(again.header("oncely-record"), original);
    let other = order(&gw, "attempt-2", r#"{"sku": "other", "qty": 2}"#).await;
    assert_eq!(other.status, 422, "{}", other.text());
    assert_eq!(other.json()["code"], "key_reused");

    // The answer reached a caller (the retry's): a new key with the same body now is a
    // second order, placed on purpose.
    let second = order(&gw, "attempt-3", BODY).await;
    assert_eq!(second.header("oncely-status"), "fresh", "{}", second.text());
    assert_ne!(second.header("oncely-record"), original);
    assert!(second.headers.get("oncely-key-churn").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Counted once, at the made-up key's first request.
    let metrics = get(&gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        metrics.contains(r#"oncely_key_churn_total{route="POST /v1/orders"} 1"#),
        "{metrics}"
    );
}

/// The downstream `Idempotency-Key`s an upstream saw, in order.
type Seen = Arc<std::sync::Mutex<Vec<String>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_a_new_key_runs_again_the_original_whose_failure_nobody_heard() {
    // The first execution outlasts the route's timeout (the record is released: a write
    // that failed); the next ones answer at once.
    let seen: Seen = Arc::default();
    let keys = seen.clone();
    let router = axum::Router::new().route(
        "/v1/orders",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let keys = keys.clone();
            async move {
                let n = {
                    let mut k = keys.lock().unwrap();
                    k.push(
                        headers
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned(),
                    );
                    k.len()
                };
                if n == 1 {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                format!("order #{n}: {body}")
            }
        }),
    );
    let up = upstream(router).await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            "store = \"{store}\"\nupstream = \"http://{up}\"\n[[routes]]\nmethod = \"POST\"\n\
             path = \"/v1/orders\"\nclass = \"write\"\ntimeout = \"1s\"\n"
        ),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", cfg.to_str().unwrap()], &[]);

    // The caller gives up after 300 ms; the upstream does not answer within the route's
    // 1 s, so the record is released, and nobody heard of it.
    give_up(gw.addr, "attempt-1", Duration::from_millis(300)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = stdout(&run(&["ledger", "list", "--json", "--store", &store]));
        if list.contains("released") {
            break;
        }
        assert!(Instant::now() < deadline, "never released: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The retry under a new key runs the original's record again, as the original's own
    // key would: the same record, the same downstream key.
    let retry = order(&gw, "attempt-2", BODY).await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(retry.header("oncely-status"), "fresh", "{}", retry.text());
    assert_eq!(retry.text(), format!("order #2: {BODY}"));
    let original = retry.header("oncely-record").to_owned();
    assert_eq!(retry.header("oncely-key-churn"), original);
    {
        let keys = seen.lock().unwrap();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(!keys[0].is_empty());
        assert_eq!(keys[0], keys[1], "one downstream key for both runs");
    }

    // Its key names the original from then on; the answer reached a caller, so a new key
    // with the same body is a new order.
    let again = order(&gw, "attempt-2", BODY).await;
    assert_eq!(
        again.header("oncely-status"),
        "replayed",
        "{}",
        again.text()
    );
    assert_eq!(again.header("oncely-record"), original);
    let second = order(&gw, "attempt-3", BODY).await;
    assert_eq!(second.header("oncely-status"), "fresh", "{}", second.text());
    assert_ne!(second.header("oncely-record"), original);
    assert!(second.headers.get("oncely-key-churn").is_none());
    let keys = seen.lock().unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert_ne!(keys[2], keys[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_a_new_key_after_the_original_completed_gets_its_stored_answer() {
    let (up, calls) = orders(Duration::from_millis(1500)).await;
    let (gw, _dir) = sqlite_gateway(up, "");
    give_up(gw.addr, "attempt-1", Duration::from_millis(500)).await;
    // The original runs to its end without its caller.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let retry = order(&gw, "attempt-2", BODY).await;
    assert_eq!(
        retry.header("oncely-status"),
        "replayed",
        "{}",
        retry.text()
    );
    assert_eq!(retry.header("idempotent-replayed"), "true");
    assert_eq!(retry.text(), format!("order #1: {BODY}"));
    assert_eq!(
        retry.header("oncely-key-churn"),
        retry.header("oncely-record")
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_after_the_caller_got_its_answer_is_a_new_order() {
    let (up, calls) = orders(Duration::from_millis(50)).await;
    let (gw, _dir) = sqlite_gateway(up, "");
    let first = order(&gw, "order-a", BODY).await;
    assert_eq!(first.header("oncely-status"), "fresh");
    let second = order(&gw, "order-b", BODY).await;
    assert_eq!(second.header("oncely-status"), "fresh", "{}", second.text());
    assert_ne!(
        second.header("oncely-record"),
        first.header("oncely-record")
    );
    assert!(second.headers.get("oncely-key-churn").is_none());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "two orders placed on purpose"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_requests_whose_callers_all_wait_stay_separate() {
    let (up, calls) = orders(Duration::from_millis(800)).await;
    let (gw, _dir) = sqlite_gateway(up, "");
    let gw = Arc::new(gw);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let gw = gw.clone();
            tokio::spawn(async move { order(&gw, &format!("order-{i}"), BODY).await })
        })
        .collect();
    let mut records = std::collections::HashSet::new();
    for t in tasks {
        let a = t.await.unwrap();
        assert_eq!(a.header("oncely-status"), "fresh", "{}", a.text());
        assert!(a.headers.get("oncely-key-churn").is_none());
        records.insert(a.header("oncely-record").to_owned());
    }
    assert_eq!(records.len(), 8);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        8,
        "eight orders, each executed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churn_window_of_zero_keeps_every_key_its_own() {
    let (up, calls) = orders(Duration::from_millis(1500)).await;
    let (gw, _dir) = sqlite_gateway(up, "churn_window = \"0s\"\n");
    give_up(gw.addr, "attempt-1", Duration::from_millis(300)).await;
    let retry = order(&gw, "attempt-2", BODY).await;
    assert_eq!(retry.header("oncely-status"), "fresh", "{}", retry.text());
    assert!(retry.headers.get("oncely-key-churn").is_none());
    reached(&calls, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_churn_window_a_new_key_is_a_new_order() {
    let (up, calls) = orders(Duration::from_millis(200)).await;
    let (gw, _dir) = sqlite_gateway(up, "churn_window = \"1s\"\n");
    give_up(gw.addr, "attempt-1", Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let retry = order(&gw, "attempt-2", BODY).await;
    assert_eq!(retry.header("oncely-status"), "fresh", "{}", retry.text());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_postgresql_join_a_retry_under_a_new_key() {
    let store = crate::cluster::fresh_schema(&crate::cluster::shared_url()).await;
    let (up, calls) = orders(Duration::from_secs(3)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), up, &store, "");
    let a = Gateway::start(&["--config", &cfg], &[]);
    let b = Gateway::start(&["--config", &cfg], &[]);
    give_up(a.addr, "attempt-1", Duration::from_secs(1)).await;
    // A retry loop's pause (the OpenAI and Anthropic SDKs wait half a second and more):
    // instance A must first see its caller gone and tell B (see ARCHITECTURE.md).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let retry = order(&b, "attempt-2", BODY).await;
    assert_eq!(retry.header("oncely-status"), "joined", "{}", retry.text());
    assert_eq!(retry.text(), format!("order #1: {BODY}"));
    let original = retry.header("oncely-record").to_owned();
    assert_eq!(retry.header("oncely-key-churn"), original);
    // The other instance knows the made-up key names the original too.
    let again = order(&a, "attempt-2", BODY).await;
    assert_eq!(
        again.header("oncely-status"),
        "replayed",
        "{}",
        again.text()
    );
    assert_eq!(again.header("oncely-record"), original);
    // An answer reached a caller: a third key is a new order, on either instance.
    let second = order(&a, "attempt-3", BODY).await;
    assert_eq!(second.header("oncely-status"), "fresh", "{}", second.text());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_a_new_key_after_the_gateway_was_killed_mid_call_runs_nothing_twice() {
    let (up, calls) = orders(Duration::from_secs(30)).await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = config(dir.path(), up, &store, "lease = \"1s\"\nwait = \"8s\"\n");
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let addr = gw.addr;
    let caller =
        tokio::spawn(async move { give_up(addr, "attempt-1", Duration::from_secs(30)).await });
    reached(&calls, 1).await;
    // SIGKILL mid-call: the caller's connection goes with the process.
    std::process::Command::new("kill")
        .args(["-9", &gw.pid().to_string()])
        .status()
        .unwrap();
    caller.abort();
    drop(gw);
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let retry = order(&gw, "attempt-2", BODY).await;
    // The action may have happened: it is not run again under the new key either.
    assert_eq!(retry.status, 409, "{}", retry.text());
    assert_eq!(retry.json()["code"], "outcome_unknown", "{}", retry.text());
    assert!(!retry.header("oncely-key-churn").is_empty());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "executed once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gave_up_while_the_ledger_was_locked_is_joined_by_its_retry() {
    let (up, calls) = orders(Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let store = format!("sqlite://{}", db.display());
    let cfg = config(dir.path(), up, &store, "");
    let gw = Gateway::start(&["--config", &cfg], &[]);
    // Another process holds the write lock: the claim waits behind it, and its caller
    // gives up before it lands.
    let lock = crate::faults::lock_sqlite(&db, Duration::from_secs(3));
    give_up(gw.addr, "attempt-1", Duration::from_secs(1)).await;
    let retry = order(&gw, "attempt-2", BODY).await;
    lock.join().unwrap();
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert!(
        matches!(retry.header("oncely-status"), "joined" | "replayed"),
        "{}",
        retry.text()
    );
    assert_eq!(
        retry.header("oncely-key-churn"),
        retry.header("oncely-record")
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one execution");
}
