//! The ingress: one fresh acknowledgement per event, duplicates answered without a second
//! queue entry, and every bad delivery refused with nothing written.

use std::time::Duration;

use oncely_store::{ListFilter, Store};
use oncely_webhooks::queue::TASK_KIND;

use crate::support::*;

async fn assert_nothing_written(store: &dyn Store) {
    assert!(
        store.list(&ListFilter::default()).await.unwrap().is_empty(),
        "no ledger record"
    );
    assert!(
        store.list_tasks(TASK_KIND, None).await.unwrap().is_empty(),
        "no queued delivery"
    );
}

async fn fifty_concurrent_deliveries(backend: Backend) {
    let handler = Handler::start(vec![], Answer::Status(200)).await;
    let store = backend.open().await;
    let worker = worker(store.clone(), "w1", Duration::from_secs(30));
    let gw = gateway(store.clone(), config(&handler.url()), Some(&worker)).await;
    let body = br#"{"type":"invoice.paid","data":{"id":"in_1","amount":4200}}"#;
    let headers = signed("msg_fifty", now(), body);
    let mut joins = Vec::new();
    let gw = std::sync::Arc::new(gw);
    for _ in 0..50 {
        let (gw, headers) = (gw.clone(), headers.clone());
        joins.push(tokio::spawn(async move { gw.post(&headers, body).await }));
    }
    let mut fresh = 0;
    let mut duplicate = 0;
    let mut records = std::collections::HashSet::new();
    for j in joins {
        let a = j.await.unwrap();
        assert_eq!(a.status, 200);
        match a.oncely_status.as_deref() {
            Some("fresh") => fresh += 1,
            Some("duplicate") => duplicate += 1,
            other => panic!("unexpected Oncely-Status {other:?}"),
        }
        records.insert(a.record.expect("Oncely-Record"));
    }
    assert_eq!((fresh, duplicate), (1, 49));
    assert_eq!(records.len(), 1, "every answer names the same record");
    let got = handler.wait_for(1, Duration::from_secs(10)).await;
    // Give a second delivery every chance to show up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got_after = handler.received();
    assert_eq!(
        got_after.len(),
        1,
        "the handler receives the event exactly once"
    );
    assert_eq!(got[0].key.as_deref(), Some("msg_fifty"));
    assert_eq!(&got[0].body[..], &body[..], "the original body");
    assert_eq!(
        got[0].content_type.as_deref(),
        Some("application/json; charset=utf-8"),
        "the original content type"
    );
    worker.stop().await;
    assert!(store.list_tasks(TASK_KIND, None).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_deliveries_of_one_event_sqlite() {
    fifty_concurrent_deliveries(Backend::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_deliveries_of_one_event_postgres() {
    fifty_concurrent_deliveries(Backend::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_signatures_are_refused_and_nothing_is_written() {
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let gw = gateway(store.clone(), config("http://127.0.0.1:9/hook"), None).await;
    let body = br#"{"type":"invoice.paid"}"#;
    let good = signed("msg_bad", now(), body);
    let without = |name: &str| -> Vec<(String, String)> {
        good.iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case(name))
            .cloned()
            .collect()
    };
    let replace = |name: &str, value: &str| -> Vec<(String, String)> {
        let mut h = without(name);
        h.push((name.to_string(), value.to_string()));
        h
    };
    type Case<'a> = (&'a str, Vec<(String, String)>, &'a [u8], &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            "no signature",
            without("webhook-signature"),
            body,
            "missing webhook-signature",
        ),
        (
            "no timestamp",
            without("webhook-timestamp"),
            body,
            "missing webhook-timestamp",
        ),
        (
            "malformed signature",
            replace("webhook-signature", "v1,not base64!!"),
            body,
            "malformed",
        ),
        (
            "malformed timestamp",
            replace("webhook-timestamp", "yesterday"),
            body,
            "malformed",
        ),
        (
            "tampered body",
            good.clone(),
            br#"{"type":"invoice.paid "}"#,
            "no signature matches",
        ),
        (
            "stale",
            signed("msg_bad", now() - 3600, body),
            body,
            "tolerance",
        ),
        (
            "future",
            signed("msg_bad", now() + 3600, body),
            body,
            "tolerance",
        ),
    ];
    for (name, headers, body, detail) in cases {
        let a = gw.post(&headers, body).await;
        assert_eq!(a.status, 400, "{name}");
        assert_eq!(
            a.content_type.as_deref(),
            Some("application/problem+json"),
            "{name}"
        );
        assert_eq!(a.json["code"], "signature_invalid", "{name}");
        assert_eq!(a.json["status"], 400, "{name}");
        assert!(
            a.json["title"].is_string() && a.json["type"].is_string(),
            "{name}"
        );
        let text = a.json["detail"].as_str().unwrap_or_default();
        assert!(
            text.contains(detail),
            "{name}: detail {text:?} lacks {detail:?}"
        );
        assert_eq!(a.oncely_status, None, "{name}");
    }
    // A wrong secret.
    let other: oncely_webhooks::Scheme = "standard".parse().unwrap();
    let wrong =
        oncely_webhooks::Secrets::parse(&other, "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").unwrap();
    let mut h = oncely_webhooks::sign(&other, wrong.primary(), "msg_bad", now(), body);
    h.push(("content-type".into(), "application/json".into()));
    let a = gw.post(&h, body).await;
    assert_eq!(
        (a.status, a.json["code"].as_str()),
        (400, Some("signature_invalid"))
    );
    assert_nothing_written(store.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413_and_nothing_is_written() {
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let mut c = config("http://127.0.0.1:9/hook");
    c.max_body = 1024;
    let gw = gateway(store.clone(), c, None).await;
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(2000)).into_bytes();
    let a = gw.post(&signed("msg_big", now(), &body), &body).await;
    assert_eq!(a.status, 413);
    assert_eq!(a.json["code"], "body_too_large");
    // At the limit is fine.
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(1000)).into_bytes();
    assert!(body.len() <= 1024);
    assert_nothing_written(store.as_ref()).await;
    let a = gw.post(&signed("msg_ok", now(), &body), &body).await;
    assert_eq!(a.oncely_status.as_deref(), Some("fresh"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_and_methods_are_not_handled() {
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let gw = gateway(store.clone(), config("http://127.0.0.1:9/hook"), None).await;
    let body = br#"{"a":1}"#;
    let headers = signed("msg_path", now(), body);
    let a = gw
        .send("POST", "/hooks/other", &headers, body.to_vec())
        .await;
    assert_eq!(a.status, 404);
    let a = gw.send("GET", "/hooks/standard", &headers, vec![]).await;
    assert_eq!(a.status, 405);
    assert_nothing_written(store.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_event_without_an_id_is_refused() {
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let scheme: oncely_webhooks::Scheme = "stripe".parse().unwrap();
    let secrets = oncely_webhooks::Secrets::parse(&scheme, "whsec_test_secret").unwrap();
    let verifier =
        oncely_webhooks::Verifier::new(scheme.clone(), secrets.clone(), Duration::from_secs(300));
    let mut c = config("http://127.0.0.1:9/hook");
    c.verifier = verifier;
    let gw = gateway(store.clone(), c, None).await;
    let body = br#"{"object":"event","type":"charge.succeeded"}"#;
    let headers = oncely_webhooks::sign(&scheme, secrets.primary(), "", now(), body);
    let a = gw.post(&headers, body).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json["code"], "event_id_missing");
    assert_nothing_written(store.as_ref()).await;
    // With an id it is accepted.
    let body = br#"{"id":"evt_1","object":"event","type":"charge.succeeded"}"#;
    let headers = oncely_webhooks::sign(&scheme, secrets.primary(), "", now(), body);
    assert_eq!(
        gw.post(&headers, body).await.oncely_status.as_deref(),
        Some("fresh")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedupe_fields_catch_one_event_under_two_ids() {
    let handler = Handler::start(vec![], Answer::Status(200)).await;
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let worker = worker(store.clone(), "w1", Duration::from_secs(30));
    let mut c = config(&handler.url());
    c.dedupe_fields = vec!["/type".into(), "/data/object/id".into()];
    let gw = gateway(store.clone(), c, Some(&worker)).await;
    let first = br#"{"type":"charge.succeeded","data":{"object":{"id":"ch_1"}}}"#;
    let again = br#"{"data":{"object":{"id":"ch_1"}},"type":"charge.succeeded","resent":true}"#;
    let other = br#"{"type":"charge.succeeded","data":{"object":{"id":"ch_2"}}}"#;
    let a = gw.post(&signed("msg_a", now(), first), first).await;
    assert_eq!(a.oncely_status.as_deref(), Some("fresh"));
    let b = gw.post(&signed("msg_b", now(), again), again).await;
    assert_eq!(b.status, 200);
    assert_eq!(b.oncely_status.as_deref(), Some("duplicate"));
    let matched = store
        .get(&oncely_core::RecordId(b.record.clone().unwrap()))
        .await
        .unwrap()
        .expect("the duplicate names a record");
    assert_eq!(
        matched.workflow_id.as_deref(),
        Some("msg_a"),
        "the matched record was first received as msg_a"
    );
    assert_ne!(b.record, a.record);
    let c = gw.post(&signed("msg_c", now(), other), other).await;
    assert_eq!(c.oncely_status.as_deref(), Some("fresh"));
    let got = handler.wait_for(2, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(handler.received().len(), 2);
    let mut keys: Vec<_> = got.iter().filter_map(|r| r.key.clone()).collect();
    keys.sort();
    assert_eq!(keys, ["msg_a", "msg_c"]);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_acknowledges_nothing() {
    let backend = Backend::postgres().await;
    let store = backend.open().await;
    let gw = gateway(store.clone(), config("http://127.0.0.1:9/hook"), None).await;
    // The ledger's tables vanish under the running gateway.
    backend.break_schema().await;
    let body = br#"{"n":1}"#;
    let a = gw.post(&signed("msg_down", now(), body), body).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.json["code"], "store_unavailable");
    assert_eq!(a.oncely_status, None, "not acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_events_and_deliveries() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test process");
    let handler = Handler::start(vec![Answer::Status(500)], Answer::Status(200)).await;
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let worker = worker(store.clone(), "w1", Duration::from_secs(30));
    let gw = gateway(store.clone(), config(&handler.url()), Some(&worker)).await;
    let body = br#"{"m":1}"#;
    gw.post(&signed("msg_m1", now(), body), body).await;
    gw.post(&signed("msg_m1", now(), body), body).await;
    gw.post(&signed("msg_m1", now() - 3600, body), body).await;
    handler.wait_for(2, Duration::from_secs(10)).await;
    let mut dead_cfg = config("http://127.0.0.1:1/refused");
    dead_cfg.path = "/hooks/dead".into();
    dead_cfg.max_attempts = 1;
    let dead_gw = gateway(store.clone(), dead_cfg, Some(&worker)).await;
    dead_gw
        .send(
            "POST",
            "/hooks/dead",
            &signed("msg_m2", now(), body),
            body.to_vec(),
        )
        .await;
    let start = std::time::Instant::now();
    loop {
        let text = recorder.render();
        let all = [
            r#"oncely_webhook_events_total{result="accepted"}"#,
            r#"oncely_webhook_events_total{result="duplicate"}"#,
            r#"oncely_webhook_events_total{result="rejected"}"#,
            r#"oncely_webhook_deliveries_total{result="retried"}"#,
            r#"oncely_webhook_deliveries_total{result="delivered"}"#,
            r#"oncely_webhook_deliveries_total{result="dead"}"#,
            r#"oncely_webhook_queue_depth{state="dead"}"#,
        ];
        if all.iter().all(|m| text.contains(m)) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "missing metrics in:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.stop().await;
}
