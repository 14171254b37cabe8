//! An axum service that embeds the idempotency layer around its own handler: no proxy,
//! no second process. A slow, billed "render" runs once per distinct request; repeats
//! are replayed, and a repeat that arrives while the render runs waits for it.
//!
//! Run with: `cargo run -p oncely-tower --example axum_embedded`
//! then, in another terminal, twice:
//! `curl -si -X POST localhost:3000/v1/render -H 'authorization: Bearer sk_demo' -d '{"text":"hello"}'`
//! (the first answer is `Oncely-Status: fresh`, the second `replayed`).
//!
//! The layer compiles no database driver: an embedder adds `oncely-store` with the one it
//! uses, here `oncely-store = { version = "0.1", features = ["sqlite"] }`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use http::Method;
use oncely_core::Class;
use oncely_store::{open, StoreOptions};
use oncely_tower::{Guard, IdempotencyLayer, KeyMode, RoutePolicy, UnitsRule};

async fn render(
    State(renders): State<Arc<AtomicUsize>>,
    Json(req): Json<serde_json::Value>,
) -> Json<serde_json::Value> {
    let n = renders.fetch_add(1, Ordering::SeqCst) + 1;
    // The expensive part: a render that takes a while and costs per character.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let text = req["text"].as_str().unwrap_or_default();
    Json(serde_json::json!({ "render": n, "chars": text.chars().count() }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = open("sqlite://oncely-example.db", StoreOptions::default()).await?;
    // Principals are stored as HMAC-SHA256 with a key kept in the store itself.
    let principal_key = store.secret("principal-key").await?;
    let guard = Arc::new(Guard::new(store, principal_key));

    let mut policy = RoutePolicy::new("POST /v1/render", Class::Write);
    policy.key = Arc::new(KeyMode::HeaderOrFingerprint);
    policy.units = Arc::new(UnitsRule::Json("/text".into()));
    let policy = Arc::new(policy);
    let routes = move |method: &Method, path: &str| {
        (method == Method::POST && path == "/v1/render").then(|| policy.clone())
    };

    let app = Router::new()
        .route("/v1/render", post(render))
        .with_state(Arc::new(AtomicUsize::new(0)))
        .layer(IdempotencyLayer::new(guard.clone(), routes));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Every render that was running is finished and recorded before the process ends.
    guard.drain().await;
    Ok(())
}
