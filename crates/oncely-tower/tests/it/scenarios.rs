//! The contract's scenarios end to end.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::join_all;
use oncely_core::State;

use crate::gateway::Gateway;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_identical_requests_execute_once() {
    let gw = Gateway::start().await;
    let body = r#"{"text":"Chapter one","voice":"nova"}"#;
    let answers = join_all((0..100).map(|_| {
        gw.request("/v1/render", body)
            .header("x-delay-ms", "300")
            .send()
    }))
    .await;
    assert_eq!(gw.upstream.calls("/v1/render"), 1);
    let first = &answers[0].body;
    assert!(answers.iter().all(|a| a.status == 201 && &a.body == first));
    let fresh = answers.iter().filter(|a| a.oncely() == "fresh").count();
    let joined = answers.iter().filter(|a| a.oncely() == "joined").count();
    let replayed = answers.iter().filter(|a| a.oncely() == "replayed").count();
    // One that reaches the gateway only after the 300 ms call ended (a loaded machine)
    // is replayed instead of joined; either way it is a repeat, never a second run.
    assert_eq!((fresh, joined + replayed), (1, 99));
    assert!(joined > 0, "no request waited for the running original");
    gw.guard.drain().await;
    let r = gw.store.get(&answers[0].record()).await.unwrap().unwrap();
    assert_eq!(r.repeats, 99);
}

#[tokio::test]
async fn a_duplicate_after_wait_is_in_flight_with_retry_after() {
    let gw = Gateway::start().await;
    let (first, second) = tokio::join!(
        gw.request("/v1/short-wait", "{}")
            .header("idempotency-key", "k")
            .header("x-delay-ms", "1000")
            .send(),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            gw.request("/v1/short-wait", "{}")
                .header("idempotency-key", "k")
                .send()
                .await
        }
    );
    assert_eq!(first.oncely(), "fresh");
    assert_eq!(second.status, 409);
    assert_eq!(second.code(), "in_flight");
    let retry: u64 = second.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert_eq!(gw.upstream.calls("/v1/short-wait"), 1);
}

#[tokio::test]
async fn a_client_that_hangs_up_cancels_nothing() {
    let gw = Gateway::start().await;
    let started = Instant::now();
    let gone = tokio::time::timeout(
        Duration::from_secs(1),
        gw.request("/v1/flaky-free", "{}").send(),
    )
    .await;
    // /v1/flaky-free is not guarded: a sanity check that the server answers at all.
    assert!(gone.is_ok());

    let gone = tokio::time::timeout(
        Duration::from_secs(1),
        gw.request("/v1/render", r#"{"text":"long render"}"#)
            .header("x-delay-ms", "3000")
            .send(),
    )
    .await;
    assert!(gone.is_err(), "the client hung up after 1 s");
    gw.guard.drain().await;
    assert!(started.elapsed() >= Duration::from_secs(3));
    let again = gw
        .request("/v1/render", r#"{"text":"long render"}"#)
        .send()
        .await;
    assert_eq!(again.oncely(), "replayed");
    assert_eq!(again.status, 201);
    assert_eq!(gw.upstream.calls("/v1/render"), 1);
    let r = gw.store.get(&again.record()).await.unwrap().unwrap();
    assert_eq!(r.state, State::Completed);
}

#[tokio::test]
async fn write_failures_release_and_actions_become_outcome_unknown() {
    let gw = Gateway::start().await;
    let first = gw
        .request("/v1/flaky", "{}")
        .header("idempotency-key", "w")
        .send()
        .await;
    assert_eq!((first.status.as_u16(), first.oncely()), (500, "fresh"));
    let retry = gw
        .request("/v1/flaky", "{}")
        .header("idempotency-key", "w")
        .send()
        .await;
    assert_eq!((retry.status.as_u16(), retry.oncely()), (201, "fresh"));
    let keys = gw.upstream.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "the same downstream key on every attempt");
    assert_ne!(keys[0], "w");

    let first = gw
        .request("/v1/order", "{}")
        .header("idempotency-key", "a")
        .send()
        .await;
    assert_eq!(first.status, 500);
    let retry = gw
        .request("/v1/order", "{}")
        .header("idempotency-key", "a")
        .send()
        .await;
    assert_eq!(retry.status, 409);
    assert_eq!(retry.code(), "outcome_unknown");
    assert_eq!(gw.upstream.calls("/v1/order"), 1);
}

#[tokio::test]
async fn upstream_timeout_is_504_and_the_action_is_outcome_unknown() {
    let gw = Gateway::start().await;
    let a = gw
        .request("/v1/slow", "{}")
        .header("idempotency-key", "t")
        .header("x-delay-ms", "1000")
        .send()
        .await;
    assert_eq!(a.status, 504);
    assert_eq!(a.code(), "upstream_timeout");
    let r = gw.store.get(&a.record()).await.unwrap().unwrap();
    assert_eq!(r.state, State::OutcomeUnknown);
}

/// The seed: six requests, three distinct texts → three renders, three charges, three
/// repeats that were not charged.
#[tokio::test]
async fn the_seeds_six_requests_are_three_renders() {
    let gw = Gateway::start().await;
    let texts = ["Dialogue one", "Dialogue two, longer", "Three"];
    for round in 0..2 {
        for t in texts {
            // The second round spells the same JSON differently.
            let body = if round == 0 {
                format!(r#"{{"text":"{t}","voice":"nova"}}"#)
            } else {
                format!(r#"{{ "voice": "nova", "text": "{t}" }}"#)
            };
            let a = gw.request("/v1/render", &body).send().await;
            assert_eq!(a.status, 201);
            assert_eq!(a.oncely(), if round == 0 { "fresh" } else { "replayed" });
        }
    }
    gw.guard.drain().await;
    assert_eq!(gw.upstream.calls("/v1/render"), 3);
    assert_eq!(gw.upstream.finished.load(Ordering::SeqCst), 3);
    let usage = gw.store.usage(None).await.unwrap();
    let chars: u64 = texts.iter().map(|t| t.chars().count() as u64).sum();
    assert_eq!(usage.totals.fresh, 3);
    assert_eq!(usage.totals.fresh_units, chars);
    assert_eq!(usage.totals.repeats, 3);
    assert_eq!(usage.totals.repeat_units, chars);
    assert_eq!(usage.by_principal.len(), 1);
}
