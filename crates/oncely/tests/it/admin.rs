//! The admin API through the real binary: tokens, health, metrics, records, usage.

use crate::common::{get, post, upstream, Gateway};

const METRICS: [&str; 5] = [
    "oncely_requests_total",
    "oncely_upstream_seconds",
    "oncely_in_flight",
    "oncely_outcome_unknown",
    "oncely_webhook_deliveries_total",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_variable_the_admin_api_is_closed_but_health_and_metrics_answer() {
    let up = upstream(axum::Router::new()).await;
    let gw = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", "memory:"],
        &[],
    );
    assert_eq!(get(&gw.admin_url("/healthz"), &[]).await.status, 200);
    let m = get(&gw.admin_url("/metrics"), &[]).await;
    assert_eq!(m.status, 200);
    for name in METRICS {
        assert!(
            m.text().contains(name),
            "{name} not in /metrics:\n{}",
            m.text()
        );
    }
    assert!(
        m.text()
            .contains("oncely_requests_total{route=\"POST /{*rest}\",status=\"fresh\"} 0"),
        "{}",
        m.text()
    );
    for path in ["/records", "/usage", "/records/rec_1"] {
        let res = get(&gw.admin_url(path), &[("authorization", "Bearer anything")]).await;
        assert_eq!(res.status, 403, "{path}");
        assert_eq!(res.header("content-type"), "application/problem+json");
        assert_eq!(res.json()["code"], "admin_disabled");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_opens_records_usage_and_resolve() {
    let up = upstream(axum::Router::new().fallback(|| async { "done" })).await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let gw = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", &store],
        &[("ONCELY_ADMIN_TOKEN", "s3cret")],
    );
    let auth = [("authorization", "Bearer s3cret")];
    assert_eq!(get(&gw.admin_url("/records"), &[]).await.status, 401);
    let wrong = get(
        &gw.admin_url("/records"),
        &[("authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.json()["code"], "unauthorized");

    // One guarded request makes one record.
    let res = post(
        &gw.url("/v1/thing"),
        "{}",
        &[("authorization", "Bearer user-1")],
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let id = res.header("oncely-record").to_owned();

    // The owner records its answer as the body finishes streaming: give it a moment.
    let mut list = get(&gw.admin_url("/records?status=completed"), &auth).await;
    for _ in 0..50 {
        if list.status != 200 || list.json()[0]["id"] == id.as_str() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        list = get(&gw.admin_url("/records?status=completed"), &auth).await;
    }
    assert_eq!(list.status, 200, "{}", list.text());
    assert_eq!(list.json()[0]["id"], id.as_str());
    assert_eq!(list.json()[0]["route"], "POST /{*rest}");
    let bad = get(&gw.admin_url("/records?status=done"), &auth).await;
    assert_eq!(bad.status, 400);
    let one = get(&gw.admin_url(&format!("/records/{id}")), &auth).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json()["response"]["body"], "done");
    let missing = get(&gw.admin_url("/records/rec_missing"), &auth).await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.header("content-type"), "application/problem+json");

    // A completed record cannot be resolved: 409.
    let res = post(
        &gw.admin_url(&format!("/records/{id}/resolve")),
        r#"{"released": true}"#,
        &auth,
    )
    .await;
    assert_eq!(res.status, 409, "{}", res.text());
    let res = post(
        &gw.admin_url(&format!("/records/{id}/resolve")),
        r#"{"completed": true}"#,
        &auth,
    )
    .await;
    assert_eq!(res.status, 400, "{}", res.text());

    let usage = get(&gw.admin_url("/usage"), &auth).await;
    assert_eq!(usage.status, 200);
    assert_eq!(usage.json()["totals"]["fresh"], 1);
    let m = get(&gw.admin_url("/metrics"), &[]).await;
    assert!(
        m.text()
            .contains("oncely_requests_total{route=\"POST /{*rest}\",status=\"fresh\"} 1"),
        "{}",
        m.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_checks_that_the_record_is_outcome_unknown_before_the_verdict() {
    let (_dir, store, (done, unknown, running)) = crate::cli::seeded().await;
    let up = upstream(axum::Router::new()).await;
    let gw = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", &store],
        &[("ONCELY_ADMIN_TOKEN", "s3cret")],
    );
    let auth = [("authorization", "Bearer s3cret")];
    let resolve = |id: String, body: &'static str| {
        let url = gw.admin_url(&format!("/records/{id}/resolve"));
        async move { post(&url, body, &auth).await }
    };
    // Not outcome_unknown: 409 wrong_state, whatever the verdict (a status out of range
    // included), and the record is unchanged.
    for body in [
        r#"{"completed": true, "status": 700}"#,
        r#"{"completed": true, "status": 200, "body": "other"}"#,
        r#"{"released": true}"#,
    ] {
        let res = resolve(done.id.to_string(), body).await;
        assert_eq!(res.status, 409, "{body}: {}", res.text());
        assert_eq!(res.json()["code"], "wrong_state");
        assert!(
            res.json()["detail"]
                .as_str()
                .unwrap()
                .contains("is completed, not outcome_unknown"),
            "{}",
            res.text()
        );
    }
    let res = resolve(
        running.id.to_string(),
        r#"{"completed": true, "status": 700}"#,
    )
    .await;
    assert_eq!(res.status, 409, "{}", res.text());
    let one = get(&gw.admin_url(&format!("/records/{}", done.id)), &auth).await;
    assert_eq!(one.json()["state"], "completed");
    assert_eq!(one.json()["response"]["body"], "rendered");
    // An outcome_unknown record: the status is checked (400), then it resolves.
    let res = resolve(
        unknown.id.to_string(),
        r#"{"completed": true, "status": 700}"#,
    )
    .await;
    assert_eq!(res.status, 400, "{}", res.text());
    let res = resolve(unknown.id.to_string(), r#"{"released": true}"#).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["state"], "released");
    assert_eq!(
        res.json()["last_error"],
        "resolved as released by an operator (admin API)"
    );
}
