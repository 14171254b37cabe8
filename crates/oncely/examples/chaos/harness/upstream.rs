//! The upstream service on 127.0.0.1: every `POST /{w|a|j}/{id}` is one execution, recorded
//! with the downstream `Idempotency-Key` it carried before anything else happens (the
//! effect happens on receipt), then answered after a seeded delay with a body naming the
//! intention and the execution number. `POST /internal/hook` is the webhook handler and
//! records each delivery.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::journal::{big_body, Journal};

#[derive(Clone)]
struct Upstream {
    journal: Arc<Journal>,
    count: Arc<AtomicU64>,
}

fn key_of(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

async fn execute(
    State(up): State<Upstream>,
    Path((_class, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let key = key_of(&headers);
    let n = up.count.fetch_add(1, Ordering::SeqCst) + 1;
    up.journal.exec(&id, &key, n);
    let mut rng = StdRng::seed_from_u64(up.journal.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let ms = if rng.random_bool(0.1) {
        rng.random_range(800..2000)
    } else {
        rng.random_range(10..400)
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    let head = serde_json::json!({"intent": id, "exec": n, "key": key});
    let size = big_body(&id);
    let body = if size > 0 {
        let mut s = head.to_string();
        s.pop();
        s.push_str(",\"pad\":\"");
        s.push_str(&"x".repeat(size));
        s.push_str("\"}");
        s
    } else {
        head.to_string()
    };
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        body,
    )
}

async fn hook(State(up): State<Upstream>, headers: HeaderMap, body: String) -> StatusCode {
    let key = key_of(&headers);
    let event: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let event = event["id"].as_str().unwrap_or("");
    // evt_SEED_ID → ID
    let intent = event.splitn(3, '_').nth(2).unwrap_or(event);
    up.journal.delivery(intent, &key);
    tokio::time::sleep(Duration::from_millis(20)).await;
    StatusCode::OK
}

/// Serves the upstream on 127.0.0.1:0.
pub(crate) async fn start(journal: Arc<Journal>) -> SocketAddr {
    let state = Upstream {
        journal,
        count: Arc::new(AtomicU64::new(0)),
    };
    let router = axum::Router::new()
        .route("/internal/hook", post(hook))
        .route("/{class}/{id}", post(execute))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the upstream");
    let addr = listener.local_addr().expect("upstream address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}
