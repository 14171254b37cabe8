//! A route's `retries` and `retry_backoff`, through the real binary: a read is tried again
//! after 502/503/504 and after a refused connection, up to its attempt limit and within
//! its `timeout`; any other class only when the request never reached the upstream
//! (a refused connection), so that it still executes once.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::StatusCode;

use crate::common::{get, post as http_post, run, stderr, stdout, upstream, Gateway};

const AUTH: [(&str, &str); 1] = [("authorization", "Bearer sk_retries")];
const RETRY_LINE: &str = "retrying a temporary upstream failure";

/// What the upstream saw and what it answers next: the n-th request gets `script[n]`,
/// or the script's last status once it has run out.
#[derive(Clone)]
struct Scripted {
    script: Arc<Vec<u16>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl Scripted {
    fn calls(&self) -> usize {
        self.bodies.lock().unwrap().len()
    }

    fn bodies(&self) -> Vec<Bytes> {
        self.bodies.lock().unwrap().clone()
    }
}

async fn answer(State(s): State<Scripted>, body: Bytes) -> (StatusCode, String) {
    let n = {
        let mut bodies = s.bodies.lock().unwrap();
        bodies.push(body);
        bodies.len() - 1
    };
    let status = s.script.get(n).or(s.script.last()).copied().unwrap();
    (StatusCode::from_u16(status).unwrap(), format!("answer {n}"))
}

fn router(script: &[u16]) -> (axum::Router, Scripted) {
    let s = Scripted {
        script: Arc::new(script.to_vec()),
        bodies: Arc::default(),
    };
    let router = axum::Router::new()
        .route("/v1/call", post(answer))
        .with_state(s.clone());
    (router, s)
}

/// An upstream on `/v1/call` answering `script`; returns its URL.
async fn scripted(script: &[u16]) -> (String, Scripted) {
    let (router, s) = router(script);
    let addr = upstream(router).await;
    (format!("http://{addr}"), s)
}

/// Starts a gateway whose one route, `POST /v1/call`, has these `route` lines.
fn gateway(dir: &Path, upstream: &str, route: &str) -> (Gateway, String) {
    let store = format!("sqlite://{}", dir.join("ledger.db").display());
    let path = dir.join("oncely.toml");
    std::fs::write(
        &path,
        format!(
            r#"
store = "{store}"
upstream = "{upstream}"

[[routes]]
method = "POST"
path = "/v1/call"
principal = "header:authorization"
{route}
"#
        ),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", path.to_str().unwrap()], &[]);
    (gw, store)
}

fn ledger(store: &str) -> Vec<serde_json::Value> {
    let out = run(&["ledger", "list", "--json", "--store", store]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str::<serde_json::Value>(&stdout(&out))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn retry_lines(gw: &Gateway) -> Vec<String> {
    gw.lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(RETRY_LINE))
        .cloned()
        .collect()
}

/// The value of `oncely_upstream_retries_total` for this route and reason.
async fn retries_metric(gw: &Gateway, reason: &str) -> Option<f64> {
    let text = get(&gw.admin_url("/metrics"), &[]).await.text();
    text.lines()
        .filter(|l| l.starts_with("oncely_upstream_retries_total{"))
        .filter(|l| l.contains(r#"route="POST /v1/call""#))
        .find(|l| l.contains(&format!(r#"reason="{reason}""#)))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

/// A port on 127.0.0.1 that nothing listens on (bound, then let go).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn a_read_is_retried_after_503s_and_the_caller_gets_the_200() {
    let dir = tempfile::tempdir().unwrap();
    let (up, seen) = scripted(&[503, 503, 200]).await;
    let (gw, _) = gateway(
        dir.path(),
        &up,
        "class = \"read\"\nretries = 2\nretry_backoff = \"20ms\"",
    );
    let res = http_post(&gw.url("/v1/call"), r#"{"q":"kept"}"#, &AUTH).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.text(), "answer 2");
    // The body was kept and sent whole each time.
    assert_eq!(seen.bodies(), vec![Bytes::from(r#"{"q":"kept"}"#); 3]);
    let lines = retry_lines(&gw);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (n, line) in lines.iter().enumerate() {
        assert!(line.contains("POST /v1/call"), "{line}");
        assert!(line.contains("reason=status_503"), "{line}");
        assert!(line.contains(&format!("attempt={}", n + 2)), "{line}");
        assert!(line.contains("delay="), "{line}");
    }
    assert_eq!(retries_metric(&gw, "status_503").await, Some(2.0));
}

#[tokio::test]
async fn a_read_stops_at_its_attempt_limit_and_the_caller_gets_the_last_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (up, seen) = scripted(&[503]).await;
    let (gw, _) = gateway(
        dir.path(),
        &up,
        "class = \"read\"\nretries = 2\nretry_backoff = \"20ms\"",
    );
    let res = http_post(&gw.url("/v1/call"), "q", &AUTH).await;
    assert_eq!(res.status, 503);
    assert_eq!(res.text(), "answer 2");
    assert_eq!(seen.calls(), 3);
    assert_eq!(retries_metric(&gw, "status_503").await, Some(2.0));
}

#[tokio::test]
async fn a_read_without_retries_is_sent_once() {
    let dir = tempfile::tempdir().unwrap();
    let (up, seen) = scripted(&[503, 200]).await;
    let (gw, _) = gateway(dir.path(), &up, "class = \"read\"");
    let res = http_post(&gw.url("/v1/call"), "q", &AUTH).await;
    assert_eq!(res.status, 503);
    assert_eq!(seen.calls(), 1);
    assert!(retry_lines(&gw).is_empty());
}

#[tokio::test]
async fn writes_and_actions_are_not_retried_after_an_answer() {
    for (class, status) in [("write", 503), ("write", 502), ("action", 504)] {
        let dir = tempfile::tempdir().unwrap();
        let (up, seen) = scripted(&[status, 200]).await;
        let (gw, store) = gateway(
            dir.path(),
            &up,
            &format!("class = \"{class}\"\nretries = 3\nretry_backoff = \"20ms\""),
        );
        let res = http_post(&gw.url("/v1/call"), "do it", &AUTH).await;
        assert_eq!(res.status, status, "{class}: {}", res.text());
        assert_eq!(seen.calls(), 1, "{class} {status} was sent again");
        assert!(retry_lines(&gw).is_empty(), "{class}");
        let records = ledger(&store);
        assert_eq!(records.len(), 1, "{records:?}");
        assert_ne!(records[0]["state"], "completed", "{records:?}");
    }
}

#[tokio::test]
async fn a_write_whose_upstream_refused_is_retried_once_it_listens_and_executes_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = closed_port();
    let (gw, store) = gateway(
        dir.path(),
        &format!("http://127.0.0.1:{port}"),
        "class = \"write\"\ntimeout = \"30s\"\nretries = 10\nretry_backoff = \"100ms\"",
    );
    let url = gw.url("/v1/call");
    let call = tokio::spawn(async move { http_post(&url, "order 1", &AUTH).await });
    // The first attempt was refused: the gateway says so before its backoff.
    let deadline = Instant::now() + Duration::from_secs(20);
    while retry_lines(&gw).is_empty() {
        assert!(Instant::now() < deadline, "no retry was logged");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let line = &retry_lines(&gw)[0];
    assert!(line.contains("reason=connect"), "{line}");
    let (router, seen) = router(&[200]);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let res = call.await.unwrap();
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("oncely-status"), "fresh");
    assert_eq!(seen.calls(), 1);
    assert_eq!(seen.bodies(), [Bytes::from("order 1")]);
    let records = ledger(&store);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["state"], "completed", "{records:?}");
    assert!(retries_metric(&gw, "connect").await.unwrap() >= 1.0);

    // A repeat is replayed: still one execution.
    let again = http_post(&gw.url("/v1/call"), "order 1", &AUTH).await;
    assert_eq!(again.header("oncely-status"), "replayed");
    assert_eq!(seen.calls(), 1);
}

#[tokio::test]
async fn retries_stay_within_the_routes_timeout() {
    // A read that always gets 503: ten retries at 400ms doubling would take minutes.
    let dir = tempfile::tempdir().unwrap();
    let (up, seen) = scripted(&[503]).await;
    let (gw, _) = gateway(
        dir.path(),
        &up,
        "class = \"read\"\ntimeout = \"1s\"\nretries = 10\nretry_backoff = \"400ms\"",
    );
    let started = Instant::now();
    let res = http_post(&gw.url("/v1/call"), "q", &AUTH).await;
    let took = started.elapsed();
    assert_eq!(res.status, 503);
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!((1..=10).contains(&seen.calls()), "{} calls", seen.calls());

    // An action whose upstream never listens: the retries give up before the owner's
    // timeout, so nothing is taken for an effect that may have happened.
    let dir = tempfile::tempdir().unwrap();
    let (gw, store) = gateway(
        dir.path(),
        &format!("http://127.0.0.1:{}", closed_port()),
        "class = \"action\"\ntimeout = \"1s\"\nretries = 10\nretry_backoff = \"300ms\"",
    );
    let started = Instant::now();
    let res = http_post(&gw.url("/v1/call"), "pay", &AUTH).await;
    let took = started.elapsed();
    assert_eq!(res.status, 502, "{}", res.text());
    assert_eq!(res.json()["code"], "upstream_unreachable");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let records = ledger(&store);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["state"], "released", "{records:?}");
}
