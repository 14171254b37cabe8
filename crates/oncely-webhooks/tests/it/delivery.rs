//! Delivery: retries with the same key, dead letters and redelivery, timeouts, workers
//! that die, and several workers on one ledger.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncely_store::{Store, TaskState};
use oncely_webhooks::queue::TASK_KIND;
use oncely_webhooks::{admin_router, list_dead, redeliver};

use crate::support::*;

async fn wait_until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < within,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn queue_empty(store: &Arc<dyn Store>) -> bool {
    store.list_tasks(TASK_KIND, None).await.unwrap().is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_with_the_same_key_until_delivered() {
    let handler = Handler::start(
        vec![Answer::Status(500), Answer::Status(503)],
        Answer::Status(200),
    )
    .await;
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let worker = worker(store.clone(), "w1", Duration::from_secs(30));
    let gw = gateway(store.clone(), config(&handler.url()), Some(&worker)).await;
    let body = br#"{"n":1}"#;
    let a = gw.post(&signed("msg_retry", now(), body), body).await;
    assert_eq!(a.oncely_status.as_deref(), Some("fresh"));
    let got = handler.wait_for(3, Duration::from_secs(10)).await;
    assert!(got.iter().all(|r| r.key.as_deref() == Some("msg_retry")));
    assert!(got.iter().all(|r| &r.body[..] == body));
    wait_until("the task is done", Duration::from_secs(5), || {
        queue_empty(&store)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        handler.received().len(),
        3,
        "delivered on the 3rd attempt, then no more"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_after_max_attempts_then_redelivered() {
    let handler = Handler::start(vec![], Answer::Status(500)).await;
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let worker = worker(store.clone(), "w1", Duration::from_secs(30));
    let mut c = config(&handler.url());
    c.max_attempts = 3;
    let gw = gateway(store.clone(), c, Some(&worker)).await;
    let body = br#"{"doomed":true}"#;
    let a = gw.post(&signed("msg_dead", now(), body), body).await;
    let record = a.record.unwrap();
    wait_until("the delivery is dead", Duration::from_secs(10), || async {
        store.task_counts(TASK_KIND).await.unwrap().dead == 1
    })
    .await;
    assert_eq!(handler.received().len(), 3, "max_attempts attempts");
    let dead = list_dead(store.as_ref()).await.unwrap();
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.event_id, "msg_dead");
    assert_eq!(d.record.as_deref(), Some(record.as_str()));
    assert_eq!(d.attempts, 3);
    assert_eq!(d.state, "dead");
    assert_eq!(d.deliver_to, handler.url());
    assert_eq!(d.body_bytes, body.len());
    assert!(d.last_error.as_deref().unwrap().contains("500"), "{d:?}");
    let json = serde_json::to_value(&dead).unwrap();
    assert_eq!(json[0]["event_id"], "msg_dead");

    // The admin API shows the same, and redelivers by record id.
    let admin = Gateway::start(admin_router(store.clone(), Some(worker.waker()))).await;
    let listed = admin.send("GET", "/webhooks/dead", &[], vec![]).await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json[0]["id"], d.id.as_str());
    let missing = admin
        .send("POST", "/webhooks/dead/task_nope/redeliver", &[], vec![])
        .await;
    assert_eq!(
        (missing.status, missing.json["code"].as_str()),
        (404, Some("not_found"))
    );

    handler.answer_from_now(Answer::Status(200));
    let again = admin
        .send(
            "POST",
            &format!("/webhooks/dead/{record}/redeliver"),
            &[],
            vec![],
        )
        .await;
    assert_eq!(again.status, 200, "{:?}", again.json);
    assert_eq!(again.json["state"], "pending");
    let got = handler.wait_for(4, Duration::from_secs(10)).await;
    assert_eq!(got[3].key.as_deref(), Some("msg_dead"));
    assert_eq!(&got[3].body[..], body);
    wait_until("the redelivery is done", Duration::from_secs(5), || {
        queue_empty(&store)
    })
    .await;
    assert!(list_dead(store.as_ref()).await.unwrap().is_empty());
    // Redelivering what is no longer dead is refused.
    assert!(redeliver(store.as_ref(), &d.id).await.is_err());
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_handler_counts_as_a_failed_attempt() {
    let handler = Handler::start(vec![], Answer::Slow(Duration::from_secs(30))).await;
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let worker = worker(store.clone(), "w1", Duration::from_secs(30));
    let mut c = config(&handler.url());
    c.max_attempts = 2;
    c.deliver_timeout = Duration::from_millis(300);
    let gw = gateway(store.clone(), c, Some(&worker)).await;
    let started = Instant::now();
    let body = br#"{"slow":true}"#;
    gw.post(&signed("msg_hang", now(), body), body).await;
    wait_until("the delivery is dead", Duration::from_secs(10), || async {
        store.task_counts(TASK_KIND).await.unwrap().dead == 1
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let dead = list_dead(store.as_ref()).await.unwrap();
    assert_eq!(dead[0].attempts, 2);
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("did not answer within 300 ms"),
        "{:?}",
        dead[0].last_error
    );
    assert_eq!(handler.received().len(), 2);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_mid_delivery_leaves_it_to_another() {
    // The first request hangs (the worker dies meanwhile); later ones answer at once.
    let handler = Handler::start(
        vec![Answer::Slow(Duration::from_secs(20))],
        Answer::Status(200),
    )
    .await;
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let lease = Duration::from_millis(1500);
    let doomed = worker(store.clone(), "doomed", lease);
    let gw = gateway(store.clone(), config(&handler.url()), Some(&doomed)).await;
    let body = br#"{"crash":"mid-delivery"}"#;
    gw.post(&signed("msg_crash", now(), body), body).await;
    handler.wait_for(1, Duration::from_secs(5)).await;
    doomed.abort();
    let task = &store.list_tasks(TASK_KIND, None).await.unwrap()[0];
    assert_eq!(task.state, TaskState::Running);
    assert_eq!(task.owner.as_deref(), Some("doomed"));
    let second_store = backend.open().await;
    let heir = worker(second_store, "heir", lease);
    let got = handler.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(got[1].key.as_deref(), Some("msg_crash"), "the same key");
    assert_eq!(&got[1].body[..], body);
    wait_until("the task is done", Duration::from_secs(5), || {
        queue_empty(&store)
    })
    .await;
    heir.stop().await;
}

async fn two_workers_never_deliver_one_event_at_once(backend: Backend) {
    let handler = Handler::start(vec![], Answer::Slow(Duration::from_millis(30))).await;
    let a = backend.open().await;
    let b = backend.open().await;
    let gw = gateway(a.clone(), config(&handler.url()), None).await;
    for i in 0..30 {
        let body = format!("{{\"i\":{i}}}").into_bytes();
        let r = gw
            .post(&signed(&format!("msg_{i}"), now(), &body), &body)
            .await;
        assert_eq!(r.oncely_status.as_deref(), Some("fresh"));
    }
    let wa = worker(a.clone(), "wa", Duration::from_secs(30));
    let wb = worker(b.clone(), "wb", Duration::from_secs(30));
    let got = handler.wait_for(30, Duration::from_secs(20)).await;
    wait_until("the queue is empty", Duration::from_secs(10), || {
        queue_empty(&a)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(handler.received().len(), 30, "each event delivered once");
    let keys: std::collections::HashSet<_> = got.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!(keys.len(), 30);
    assert!(
        handler.overlaps().is_empty(),
        "concurrent deliveries: {:?}",
        handler.overlaps()
    );
    wa.stop().await;
    wb.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_on_one_sqlite_file() {
    two_workers_never_deliver_one_event_at_once(Backend::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_on_one_postgres_database() {
    two_workers_never_deliver_one_event_at_once(Backend::postgres().await).await;
}
