//! Reconciliation by the server itself, through the real binary: an `action` whose
//! outcome is unknown is asked about at its route's `reconcile` endpoint from
//! `reconcile_after` on; 2xx completes it, 404 releases it, anything else leaves it
//! unknown and is asked again later.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::routing::post;
use http::{HeaderMap, StatusCode};

use crate::common::{get, post as http_post, run, stdout, upstream, Gateway};

/// What the order service knows about one reference (the downstream key).
#[derive(Clone, Debug, PartialEq)]
enum Order {
    /// Received, still being placed: its own lookup says 404 until it is done.
    Working,
    Placed(String),
    /// Its lookup answers 503 (the provider cannot tell).
    Opaque,
}

#[derive(Clone, Default)]
struct Orders {
    by_key: Arc<Mutex<HashMap<String, Order>>>,
    posts: Arc<AtomicUsize>,
    /// When each lookup (`GET`) came.
    lookups: Arc<Mutex<Vec<Instant>>>,
}

/// `POST /v1/orders` with `{"mode": "slow:MS" | "fail" | "opaque"}`; `GET
/// /v1/orders?reference=KEY` answers what it knows.
fn order_service(orders: Orders) -> axum::Router {
    axum::Router::new()
        .route(
            "/v1/orders",
            post(
                |State(o): State<Orders>, headers: HeaderMap, body: String| async move {
                    o.posts.fetch_add(1, Ordering::SeqCst);
                    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let mode = v["mode"].as_str().unwrap().to_owned();
                    if let Some(ms) = mode.strip_prefix("slow:") {
                        o.by_key.lock().unwrap().insert(key.clone(), Order::Working);
                        // The provider places the order whether or not its caller waits
                        // (axum would drop this handler when the gateway hangs up).
                        let ms: u64 = ms.parse().unwrap();
                        let placing = tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            let placed = format!("{{\"order\":\"ord_1\",\"reference\":\"{key}\"}}");
                            o.by_key
                                .lock()
                                .unwrap()
                                .insert(key, Order::Placed(placed.clone()));
                            placed
                        });
                        (StatusCode::CREATED, placing.await.unwrap())
                    } else if mode == "opaque" {
                        o.by_key.lock().unwrap().insert(key, Order::Opaque);
                        (StatusCode::INTERNAL_SERVER_ERROR, "boom".to_owned())
                    } else {
                        (StatusCode::INTERNAL_SERVER_ERROR, "boom".to_owned())
                    }
                },
            )
            .get(
                |State(o): State<Orders>, q: Query<HashMap<String, String>>| async move {
                    o.lookups.lock().unwrap().push(Instant::now());
                    let key = q.get("reference").cloned().unwrap_or_default();
                    match o.by_key.lock().unwrap().get(&key) {
                        Some(Order::Placed(body)) => (StatusCode::OK, body.clone()),
                        Some(Order::Opaque) => {
                            (StatusCode::SERVICE_UNAVAILABLE, "cannot tell".to_owned())
                        }
                        Some(Order::Working) | None => (StatusCode::NOT_FOUND, String::new()),
                    }
                },
            ),
        )
        .with_state(orders)
}

struct Setup {
    orders: Orders,
    gw: Gateway,
    store: String,
    _dir: tempfile::TempDir,
}

async fn setup(reconcile_after: &str) -> Setup {
    let orders = Orders::default();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (cfg, _) = write_config(&orders, dir.path(), &store, reconcile_after).await;
    let gw = start(&cfg);
    Setup {
        orders,
        gw,
        store,
        _dir: dir,
    }
}

/// The order service and the config of its `action` route on `store`.
async fn write_config(
    orders: &Orders,
    dir: &std::path::Path,
    store: &str,
    reconcile_after: &str,
) -> (String, std::net::SocketAddr) {
    let up = upstream(order_service(orders.clone())).await;
    let cfg = dir.join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = {store:?}
upstream = "http://{up}"
[[routes]]
method = "POST"
path = "/v1/orders"
class = "action"
timeout = "300ms"
reconcile = "GET /v1/orders?reference={{key}}"
reconcile_after = "{reconcile_after}"
"#
        ),
    )
    .unwrap();
    (cfg.to_str().unwrap().to_owned(), up)
}

fn start(cfg: &str) -> Gateway {
    Gateway::start(&["--config", cfg, "--log-format", "json"], &[])
}

const ALICE: [(&str, &str); 2] = [
    ("authorization", "Bearer sk_alice"),
    ("idempotency-key", "order-7"),
];

async fn state_of(store: &str, id: &str) -> serde_json::Value {
    let (store, id) = (store.to_owned(), id.to_owned());
    let o = tokio::task::spawn_blocking(move || {
        run(&["ledger", "show", &id, "--json", "--store", &store])
    })
    .await
    .unwrap();
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// Polls until the record leaves outcome_unknown or `limit` passes.
async fn settled(store: &str, id: &str, limit: Duration) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let r = state_of(store, id).await;
        if r["state"] != "outcome_unknown" || start.elapsed() > limit {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn log_lines(gw: &Gateway, needle: &str, record: &str) -> Vec<serde_json::Value> {
    gw.lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle) && l.contains(record))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn reconcile_count(gw: &Gateway, result: &str) -> u64 {
    let text = get(&gw.admin_url("/metrics"), &[]).await.text();
    let prefix = format!("oncely_reconcile_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|n| n.trim().parse().unwrap())
        .unwrap_or(0)
}

/// The original timed out at the gateway but went through upstream: the lookup finds
/// the order, and the record is completed with it; a retry gets that answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_finds_the_order_completes_the_record() {
    let s = setup("1s").await;
    let first = http_post(&s.gw.url("/v1/orders"), r#"{"mode":"slow:500"}"#, &ALICE).await;
    assert_eq!(first.status, 504, "{}", first.text());
    let id = first.header("oncely-record").to_owned();
    assert_eq!(state_of(&s.store, &id).await["state"], "outcome_unknown");

    let r = settled(&s.store, &id, Duration::from_secs(10)).await;
    assert_eq!(r["state"], "completed", "{r}");
    assert_eq!(r["response"]["status"], 200);
    assert!(
        r["last_error"].as_str().unwrap().contains("answered 200"),
        "{r}"
    );
    let again = http_post(&s.gw.url("/v1/orders"), r#"{"mode":"slow:500"}"#, &ALICE).await;
    assert_eq!(again.header("oncely-status"), "replayed");
    assert!(again.text().contains("ord_1"), "{}", again.text());
    assert_eq!(s.orders.posts.load(Ordering::SeqCst), 1, "one order placed");

    let lines = log_lines(&s.gw, "record resolved by reconciliation", &id);
    assert_eq!(lines.len(), 1, "one state change, one line");
    assert_eq!(lines[0]["to"], "completed", "{}", lines[0]);
    assert_eq!(reconcile_count(&s.gw, "completed").await, 1);
}

/// The provider never heard of it (404): released, and the retry executes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_finds_nothing_releases_the_record() {
    let s = setup("200ms").await;
    let first = http_post(&s.gw.url("/v1/orders"), r#"{"mode":"fail"}"#, &ALICE).await;
    assert_eq!(first.status, 500);
    let id = first.header("oncely-record").to_owned();
    let dup = http_post(&s.gw.url("/v1/orders"), r#"{"mode":"fail"}"#, &ALICE).await;
    let r = settled(&s.store, &id, Duration::from_secs(10)).await;
    assert_eq!(r["state"], "released", "{r}");
    assert!(r["last_error"].as_str().unwrap().contains("404"), "{r}");
    // Before reconciliation, a duplicate was refused; after it, a retry executes.
    assert!(
        dup.status == 409 && dup.header("oncely-status") == "outcome_unknown"
            || s.orders.posts.load(Ordering::SeqCst) == 1,
        "the duplicate was refused unless reconciliation beat it"
    );
    let posts = s.orders.posts.load(Ordering::SeqCst);
    let retry = http_post(&s.gw.url("/v1/orders"), r#"{"mode":"fail"}"#, &ALICE).await;
    assert_eq!(retry.header("oncely-status"), "fresh");
    assert_eq!(s.orders.posts.load(Ordering::SeqCst), posts + 1);
    let lines = log_lines(&s.gw, "record resolved by reconciliation", &id);
    assert_eq!(lines[0]["to"], "released", "{}", lines[0]);
    assert!(reconcile_count(&s.gw, "released").await >= 1);
}

/// A route's `reconcile` added by a reload (SIGHUP) is used for records that became
/// unknown before it: the reconciler scans with the current config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_added_by_a_reload_resolves_a_record_unknown_before_it() {
    let orders = Orders::default();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (cfg, _) = write_config(&orders, dir.path(), &store, "200ms").await;
    let with_reconcile = std::fs::read_to_string(&cfg).unwrap();
    let without: String = with_reconcile
        .lines()
        .filter(|l| !l.starts_with("reconcile"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&cfg, &without).unwrap();
    let gw = start(&cfg);
    let first = http_post(&gw.url("/v1/orders"), r#"{"mode":"fail"}"#, &ALICE).await;
    assert_eq!(first.status, 500);
    let id = first.header("oncely-record").to_owned();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(state_of(&store, &id).await["state"], "outcome_unknown");

    std::fs::write(&cfg, &with_reconcile).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &gw.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let r = settled(&store, &id, Duration::from_secs(10)).await;
    assert_eq!(r["state"], "released", "{r}");
    assert!(r["last_error"].as_str().unwrap().contains("404"), "{r}");
    assert!(gw
        .lines
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("config reloaded")));
}

/// The provider cannot tell (503): the record stays unknown, and is asked again with
/// growing delays; every attempt is logged and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_cannot_tell_leaves_the_record_unknown_and_retries() {
    let s = setup("200ms").await;
    let first = http_post(&s.gw.url("/v1/orders"), r#"{"mode":"opaque"}"#, &ALICE).await;
    assert_eq!(first.status, 500);
    let id = first.header("oncely-record").to_owned();
    // Attempts at about 0.2s, 0.6s (after 400ms), 1.4s (after 800ms), 3.0s.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let r = state_of(&s.store, &id).await;
    assert_eq!(r["state"], "outcome_unknown", "{r}");
    let attempts = log_lines(&s.gw, "left the record outcome_unknown", &id);
    assert!(
        (2..=4).contains(&attempts.len()),
        "backoff: {} attempts in 2.2s",
        attempts.len()
    );
    assert!(attempts[0]["reason"].as_str().unwrap().contains("503"));
    assert_eq!(
        reconcile_count(&s.gw, "unknown").await,
        attempts.len() as u64
    );
    let dup = http_post(&s.gw.url("/v1/orders"), r#"{"mode":"opaque"}"#, &ALICE).await;
    assert_eq!(dup.status, 409);
    assert_eq!(s.orders.posts.load(Ordering::SeqCst), 1);
}

/// The gateway gave up after 300ms, but the order is still being placed for 2.5s, and
/// the provider's lookup says 404 until it is done. Asking at once would release the
/// record (and let a retry place a second order); the server waits `reconcile_after`
/// (4s) from the failure and finds the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_does_not_release_an_order_still_running_upstream() {
    let s = setup("4s").await;
    let first = http_post(&s.gw.url("/v1/orders"), r#"{"mode":"slow:2500"}"#, &ALICE).await;
    assert_eq!(first.status, 504);
    let id = first.header("oncely-record").to_owned();
    let key = oncely_core::DownstreamKey::derive(
        &oncely_core::Scope::from_stored(
            state_of(&s.store, &id).await["scope"]
                .as_str()
                .unwrap()
                .to_owned(),
        ),
        "order-7",
    );
    assert_eq!(
        s.orders.by_key.lock().unwrap().get(key.as_str()),
        Some(&Order::Working),
        "the order is still being placed"
    );
    let r = settled(&s.store, &id, Duration::from_secs(12)).await;
    assert_eq!(r["state"], "completed", "{r}");
    assert!(log_lines(&s.gw, "released", &id).is_empty());
    let retry = http_post(&s.gw.url("/v1/orders"), r#"{"mode":"slow:2500"}"#, &ALICE).await;
    assert_eq!(retry.header("oncely-status"), "replayed");
    assert_eq!(
        s.orders.posts.load(Ordering::SeqCst),
        1,
        "one order, never two"
    );
}

/// Waits until the upstream got `n` lookups (or `limit` passes).
async fn lookups(orders: &Orders, n: usize, limit: Duration) -> Vec<Instant> {
    let start = Instant::now();
    loop {
        let got = orders.lookups.lock().unwrap().clone();
        if got.len() >= n || start.elapsed() > limit {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The schedule is kept in the ledger: a gateway killed after two inconclusive attempts
/// and started again continues with attempt 3 at its time (2 x 1s after attempt 2), not
/// with attempt 1 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_continues_the_reconciliation_schedule() {
    let orders = Orders::default();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (cfg, _) = write_config(&orders, dir.path(), &store, "500ms").await;
    let gw = start(&cfg);
    let first = http_post(&gw.url("/v1/orders"), r#"{"mode":"opaque"}"#, &ALICE).await;
    assert_eq!(first.status, 500);
    let id = first.header("oncely-record").to_owned();
    // Attempts at about 0.5s and 1.5s (1s after the first).
    let asked = lookups(&orders, 2, Duration::from_secs(10)).await;
    assert_eq!(asked.len(), 2);
    drop(gw); // SIGKILL
    let gw = start(&cfg);
    let asked = lookups(&orders, 3, Duration::from_secs(10)).await;
    assert_eq!(asked.len(), 3, "the restarted gateway asks again");
    let gap = asked[2].duration_since(asked[1]);
    assert!(
        gap >= Duration::from_millis(1_700),
        "attempt 3 waited its backoff (2s) across the restart, not {gap:?}"
    );
    // The attempt's log line follows its lookup: give a busy machine a moment for it.
    let mut lines = log_lines(&gw, "left the record outcome_unknown", &id);
    for _ in 0..50 {
        if !lines.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        lines = log_lines(&gw, "left the record outcome_unknown", &id);
    }
    assert_eq!(lines.len(), 1, "one attempt since the restart");
    assert_eq!(lines[0]["attempt"], 3, "the count went on: {}", lines[0]);
    assert_eq!(state_of(&store, &id).await["state"], "outcome_unknown");
}

/// PostgreSQL: two instances share one schedule, so each attempt is asked by one of
/// them: attempts 1, 2, 3 once each, with the backoff between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_ask_each_attempt_once() {
    let store = crate::cluster::fresh_schema(&crate::cluster::shared_url()).await;
    let orders = Orders::default();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = write_config(&orders, dir.path(), &store, "500ms").await;
    let gws = [start(&cfg), start(&cfg)];
    let first = http_post(&gws[0].url("/v1/orders"), r#"{"mode":"opaque"}"#, &ALICE).await;
    assert_eq!(first.status, 500);
    let id = first.header("oncely-record").to_owned();
    // Attempts at about 0.5s, 1.5s and 3.5s.
    lookups(&orders, 3, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = orders.lookups.lock().unwrap().clone();
    assert_eq!(
        asked.len(),
        3,
        "three attempts in ~4s, not one per instance each"
    );
    for pair in asked.windows(2) {
        assert!(
            pair[1].duration_since(pair[0]) >= Duration::from_millis(800),
            "two asks {:?} apart",
            pair[1].duration_since(pair[0])
        );
    }
    let mut attempts: Vec<u64> = gws
        .iter()
        .flat_map(|g| log_lines(g, "left the record outcome_unknown", &id))
        .map(|l| l["attempt"].as_u64().unwrap())
        .collect();
    attempts.sort();
    assert_eq!(attempts, [1, 2, 3]);
}
