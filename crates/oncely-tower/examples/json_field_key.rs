//! A key source of one's own: the idempotency key is a field of the JSON body (here
//! `request_id`), as some APIs take it, instead of the `Idempotency-Key` header. Adding it
//! is one `impl MakeKey` and one line of policy; no proxy code changes.
//!
//! Run with: `cargo run -p oncely-tower --example json_field_key`
//! then, in another terminal, twice:
//! `curl -si -X POST localhost:3000/v1/orders -H 'authorization: Bearer sk_demo' -H 'content-type: application/json' -d '{"request_id":"r-1","item":"tea"}'`
//! (the first answer is `Oncely-Status: fresh`, the second `replayed`; another
//! `request_id` places another order, and a body without one is refused with 400
//! `key_missing`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use http::Method;
use oncely_core::{Class, ClientKey};
use oncely_store::{open, StoreOptions};
use oncely_tower::{
    Guard, IdempotencyLayer, MakeKey, Problem, ProblemCode, RequestHead, RoutePolicy,
};

/// The key is the string at a JSON pointer into the request body.
#[derive(Debug)]
pub(crate) struct JsonFieldKey {
    /// A JSON pointer, e.g. `/request_id`.
    pub(crate) pointer: String,
}

impl MakeKey for JsonFieldKey {
    fn make_key(&self, _head: &RequestHead<'_>, body: &[u8]) -> Result<Option<ClientKey>, Problem> {
        let value = serde_json::from_slice::<serde_json::Value>(body).ok();
        match value.as_ref().and_then(|v| v.pointer(&self.pointer)) {
            Some(serde_json::Value::String(key)) => ClientKey::parse(key.as_bytes())
                .map(Some)
                .map_err(|e| Problem::new(ProblemCode::KeyInvalid, e.to_string())),
            Some(_) => Err(Problem::new(
                ProblemCode::KeyInvalid,
                format!("the body's {} is not a string", self.pointer),
            )),
            None => Err(Problem::new(
                ProblemCode::KeyMissing,
                format!(
                    "the request body has no {} (the idempotency key)",
                    self.pointer
                ),
            )),
        }
    }

    /// The key is in the body: the layer reads the body before it asks.
    fn reads_body(&self) -> bool {
        true
    }
}

/// Places an order: the expensive, non-repeatable part. Counts how often it ran.
async fn place_order(
    State(orders): State<Arc<AtomicUsize>>,
    Json(req): Json<serde_json::Value>,
) -> Json<serde_json::Value> {
    let n = orders.fetch_add(1, Ordering::SeqCst) + 1;
    Json(serde_json::json!({ "order": n, "item": req["item"] }))
}

/// The service: `POST /v1/orders`, guarded with the key taken from `/request_id`.
/// `orders` counts the orders actually placed.
pub(crate) fn app(guard: Arc<Guard>, orders: Arc<AtomicUsize>) -> Router {
    let mut policy = RoutePolicy::new("POST /v1/orders", Class::Write);
    policy.key = Arc::new(JsonFieldKey {
        pointer: "/request_id".into(),
    });
    let policy = Arc::new(policy);
    let routes = move |method: &Method, path: &str| {
        (method == Method::POST && path == "/v1/orders").then(|| policy.clone())
    };
    Router::new()
        .route("/v1/orders", post(place_order))
        .with_state(orders)
        .layer(IdempotencyLayer::new(guard, routes))
}

#[allow(dead_code)] // The integration tests include this file for `app`, not `main`.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = open("sqlite://oncely-example.db", StoreOptions::default()).await?;
    let guard = Arc::new(Guard::new(
        store.clone(),
        store.secret("principal-key").await?,
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("orders on http://{}/v1/orders", listener.local_addr()?);
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    axum::serve(listener, app(guard.clone(), Arc::default()))
        .with_graceful_shutdown(ctrl_c)
        .await?;
    // Orders being placed at Ctrl-C are finished and recorded before the process ends.
    guard.drain().await;
    Ok(())
}
