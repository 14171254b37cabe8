//! End to end through the real binary: `oncely serve --upstream ... --store sqlite://...`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;

use crate::common::{post as http_post, run, stderr, stdout, upstream, Gateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_post_executes_once_and_is_replayed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let up = upstream(axum::Router::new().route(
        "/v1/render",
        post(move |body: String| {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                (
                    [("x-request-id", "req_42")],
                    format!("rendered #{n}: {body}"),
                )
            }
        }),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let gw = Gateway::start(
        &[
            "--upstream",
            &format!("http://{up}"),
            "--store",
            &store,
            "--log-format",
            "json",
        ],
        &[],
    );
    let headers = [
        ("authorization", "Bearer sk_alice"),
        ("content-type", "application/json"),
        ("x-workflow-id", "wf-9"),
    ];
    let first = http_post(&gw.url("/v1/render"), r#"{"text":"hi"}"#, &headers).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("oncely-status"), "fresh");
    let again = http_post(&gw.url("/v1/render"), r#"{"text":"hi"}"#, &headers).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.header("oncely-status"), "replayed");
    assert_eq!(again.header("idempotent-replayed"), "true");
    assert_eq!(again.header("oncely-record"), first.header("oncely-record"));
    assert_eq!(again.body, first.body);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the upstream ran once");

    // A GET is not guarded.
    let read = crate::common::get(&gw.url("/v1/render"), &headers).await;
    assert_eq!(read.status, 405);
    assert!(read.headers.get("oncely-status").is_none());

    // The JSON log has one line per guarded request with the contract's fields at the
    // top level.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = gw.lines.lock().unwrap().clone();
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter(|v: &serde_json::Value| v.get("record").is_some())
        .collect();
    assert_eq!(events.len(), 2, "{lines:#?}");
    for field in [
        "record",
        "route",
        "principal",
        "status",
        "attempt",
        "workflow_id",
        "upstream_status",
        "provider_request_id",
        "duration_ms",
    ] {
        assert!(
            events[0].get(field).is_some(),
            "{field} missing: {}",
            events[0]
        );
    }
    assert_eq!(events[0]["status"], "fresh");
    assert_eq!(events[1]["status"], "replayed");
    assert_eq!(events[0]["workflow_id"], "wf-9");

    // SIGTERM: exits 0.
    let status = gw.terminate();
    assert_eq!(status.code(), Some(0));

    // The ledger shows the record, and usage counts the repeat.
    let list = run(&["ledger", "list", "--json", "--store", &store]);
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    let list: serde_json::Value = serde_json::from_str(&stdout(&list)).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["repeats"], 1);
    assert_eq!(list[0]["route"], "POST /{*rest}");
    // --principal takes the raw value and hashes it with the store's key.
    let mine = run(&[
        "ledger",
        "list",
        "--json",
        "--principal",
        "Bearer sk_alice",
        "--store",
        &store,
    ]);
    let mine: serde_json::Value = serde_json::from_str(&stdout(&mine)).unwrap();
    assert_eq!(mine.as_array().unwrap().len(), 1, "{mine}");
    let theirs = run(&[
        "ledger",
        "list",
        "--json",
        "--principal",
        "Bearer sk_bob",
        "--store",
        &store,
    ]);
    let theirs: serde_json::Value = serde_json::from_str(&stdout(&theirs)).unwrap();
    assert_eq!(theirs, serde_json::json!([]));
    let hash = list[0]["principal"].as_str().unwrap();
    let by_hash = run(&[
        "ledger",
        "list",
        "--json",
        "--principal",
        hash,
        "--store",
        &store,
    ]);
    let by_hash: serde_json::Value = serde_json::from_str(&stdout(&by_hash)).unwrap();
    assert_eq!(by_hash.as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_in_flight_request_finish() {
    let up = upstream(axum::Router::new().route(
        "/slow",
        post(|| async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            "finally"
        }),
    ))
    .await;
    let gw = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", "memory:"],
        &[],
    );
    let url = gw.url("/slow");
    let req =
        tokio::spawn(async move { http_post(&url, "x", &[("authorization", "Bearer a")]).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let res = req.await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(res.text(), "finally");
}
