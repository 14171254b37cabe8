//! PostgreSQL through the real binary: two `oncely serve` processes on one database are
//! one gateway (40 identical concurrent requests split across them execute once; a
//! duplicate at one instance joins an original running at the other; one instance's sweep
//! leaves the other's live owner alone), and a gateway
//! whose PostgreSQL goes away answers guarded requests 503 `store_unavailable` without
//! forwarding them, passes unguarded ones, and recovers without a restart.
//!
//! The shared server is `ONCELY_TEST_PG_URL` (set by `scripts/test`); on CI its absence
//! fails the tests, elsewhere a throwaway server is started with `scripts/pg-env serve`.
//! The store_unavailable test always starts a server of its own, since it stops it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::{get, post};

use crate::common::{get as http_get, post as http_post, upstream, Answer, Gateway};

use oncely_store_conformance::testing::PgServer;
pub(crate) use oncely_store_conformance::testing::{
    fresh_pg_schema as fresh_schema, shared_pg_url as shared_url,
};

/// An upstream whose `POST /v1/render` takes `delay` and counts its executions.
async fn counting_upstream(delay: Duration) -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let addr = upstream(
        axum::Router::new()
            .route(
                "/v1/render",
                post(move |body: String| {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        tokio::time::sleep(delay).await;
                        format!("render #{n}: {body}")
                    }
                }),
            )
            .route("/v1/voices", get(|| async { "alloy, verse" })),
    )
    .await;
    (format!("http://{addr}"), calls)
}

/// Waits (at most 10 s) until the original reached the upstream.
async fn reached(calls: &AtomicUsize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the original never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const AUTH: [(&str, &str); 1] = [("authorization", "Bearer sk_cluster")];

fn serve(upstream: &str, store: &str) -> Gateway {
    Gateway::start(&["--upstream", upstream, "--store", store], &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_database_execute_forty_identical_requests_once() {
    let store = fresh_schema(&shared_url()).await;
    let (up, calls) = counting_upstream(Duration::from_millis(1500)).await;
    let a = serve(&up, &store);
    let b = serve(&up, &store);
    let urls = [a.url("/v1/render"), b.url("/v1/render")];
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let url = urls[i % 2].clone();
            tokio::spawn(async move { (i % 2, http_post(&url, "chapter 12", &AUTH).await) })
        })
        .collect();
    let mut answers: Vec<(usize, Answer)> = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one upstream execution");
    let record = answers[0].1.header("oncely-record").to_owned();
    let mut fresh = 0;
    for (_, a) in &answers {
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(a.text(), "render #1: chapter 12", "identical answers");
        assert_eq!(a.header("oncely-record"), record, "one record");
        match a.header("oncely-status") {
            "fresh" => fresh += 1,
            "joined" | "replayed" => assert_eq!(a.header("idempotent-replayed"), "true"),
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(fresh, 1);
    // Both instances answered duplicates that the other (or they) executed.
    for instance in 0..2 {
        assert!(answers
            .iter()
            .any(|(i, a)| *i == instance && a.header("oncely-status") != "fresh"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_at_one_instance_joins_the_original_running_at_the_other() {
    let store = fresh_schema(&shared_url()).await;
    let (up, calls) = counting_upstream(Duration::from_millis(2000)).await;
    let a = serve(&up, &store);
    let b = serve(&up, &store);
    let url_a = a.url("/v1/render");
    let original = tokio::spawn(async move { http_post(&url_a, "chapter 3", &AUTH).await });
    reached(&calls).await;
    let started = Instant::now();
    let dup = http_post(&b.url("/v1/render"), "chapter 3", &AUTH).await;
    let waited = started.elapsed();
    let original = original.await.unwrap();
    assert_eq!(original.header("oncely-status"), "fresh");
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(dup.header("oncely-status"), "joined");
    assert_eq!(dup.header("idempotent-replayed"), "true");
    assert_eq!(
        dup.header("oncely-record"),
        original.header("oncely-record")
    );
    assert_eq!(dup.body, original.body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // It was woken by the other instance's completion (LISTEN/NOTIFY), not by `wait`
    // (20s) running out.
    assert!(waited < Duration::from_secs(5), "the join took {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_unavailable_refuses_guarded_requests_and_recovers_without_a_restart() {
    // A server of this test's own: it is stopped and started again.
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let (up, calls) = counting_upstream(Duration::ZERO).await;
    let gw = serve(&up, &pg.url);
    let render = gw.url("/v1/render");
    let ok = http_post(&render, "before", &AUTH).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.header("oncely-status"), "fresh");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let pg = tokio::task::spawn_blocking(move || {
        pg.stop();
        pg
    })
    .await
    .unwrap();
    for body in ["while down 1", "while down 2"] {
        let refused = http_post(&render, body, &AUTH).await;
        assert_eq!(refused.status, 503, "{body}: {}", refused.text());
        assert_eq!(refused.header("content-type"), "application/problem+json");
        assert_eq!(refused.json()["code"], "store_unavailable");
    }
    // A repeat of a completed request is either refused the same way or replayed from
    // memory; it is never executed again.
    let repeat = http_post(&render, "before", &AUTH).await;
    match repeat.status.as_u16() {
        503 => assert_eq!(repeat.json()["code"], "store_unavailable"),
        200 => assert_eq!(repeat.header("oncely-status"), "replayed"),
        other => panic!("{other}: {}", repeat.text()),
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "nothing guarded was forwarded"
    );
    // Unguarded requests (a GET matches no guarded method) still pass.
    let read = http_get(&gw.url("/v1/voices"), &AUTH).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.text(), "alloy, verse");
    // A guarded route's request without its principal is bypassed, not refused.
    let anonymous = http_post(&render, "anonymous", &[]).await;
    assert_eq!(anonymous.status, 200, "{}", anonymous.text());
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let pg = tokio::task::spawn_blocking(move || {
        pg.start_again();
        pg
    })
    .await
    .unwrap();
    // The pool reconnects on its own: within a few seconds guarded requests work again.
    let deadline = Instant::now() + Duration::from_secs(15);
    let back = loop {
        let a = http_post(&render, "after", &AUTH).await;
        if a.status == 200 || Instant::now() > deadline {
            break a;
        }
        assert_eq!(a.status, 503, "{}", a.text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(back.status, 200, "{}", back.text());
    assert_eq!(back.header("oncely-status"), "fresh");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // And the ledger from before the outage is still there.
    let replay = http_post(&render, "before", &AUTH).await;
    assert_eq!(replay.header("oncely-status"), "replayed");
    assert_eq!(replay.body, ok.body);
    // The first "after" was answered as its answer was read; its completion may still be
    // on its way to the just-restarted server, so the repeat joins it or replays it.
    let again = http_post(&render, "after", &AUTH).await;
    assert!(
        ["replayed", "joined"].contains(&again.header("oncely-status")),
        "{:?}",
        again.header("oncely-status")
    );
    assert_eq!(again.body, back.body);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    drop(gw);
    tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instances_sweep_leaves_another_instances_live_owner_alone() {
    let store = fresh_schema(&shared_url()).await;
    // An action that runs 12 s under a lease of 1 s: its owner at B renews it every third
    // of a second, while A's sweep (every 5 s) looks at it at least twice.
    let (up, calls) = counting_upstream(Duration::from_secs(12)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            "store = {store:?}\nupstream = {up:?}\n\n[[routes]]\nmethod = \"POST\"\n\
             path = \"/v1/render\"\nclass = \"action\"\nlease = \"1s\"\ntimeout = \"60s\"\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let a = Gateway::start(&["--config", config], &[]);
    let b = Gateway::start(&["--config", config], &[]);
    let url_b = b.url("/v1/render");
    let original = tokio::spawn(async move { http_post(&url_b, "chapter 9", &AUTH).await });
    reached(&calls).await;
    // 6.5 s into the run A has swept at least once, and the lease has been renewed some
    // twenty times: the record is still B's, and a duplicate at A joins it.
    tokio::time::sleep(Duration::from_millis(6500)).await;
    let state = |id: &str| {
        let shown = crate::common::run(&["ledger", "show", id, "--json", "--store", &store]);
        serde_json::from_slice::<serde_json::Value>(&shown.stdout).unwrap()
    };
    let listed = crate::common::run(&["ledger", "list", "--json", "--store", &store]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["state"], "processing", "{listed}");
    let dup = http_post(&a.url("/v1/render"), "chapter 9", &AUTH).await;
    let original = original.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(original.header("oncely-status"), "fresh");
    assert_eq!(original.text(), "render #1: chapter 9");
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(dup.header("oncely-status"), "joined");
    assert_eq!(dup.text(), "render #1: chapter 9");
    // B recorded it, at its first attempt, and nothing ran twice.
    let shown = state(original.header("oncely-record"));
    assert_eq!(shown["state"], "completed", "{shown}");
    assert_eq!(shown["attempt"], 1, "{shown}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(
        !a.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("went away")),
        "A's sweep took B's owner for gone"
    );
}
