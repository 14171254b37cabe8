//! The `json_field_key` example, served on 127.0.0.1 with the SQLite ledger in a
//! temporary file: a key source of one's own (a field of the JSON body) guards a route
//! with no other change to the layer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use oncely_store::StoreOptions;
use oncely_tower::Guard;

#[allow(dead_code)]
#[path = "../../examples/json_field_key.rs"]
mod example;

struct Served {
    addr: std::net::SocketAddr,
    orders: Arc<AtomicUsize>,
    guard: Arc<Guard>,
    client: Client<HttpConnector, Full<Bytes>>,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start() -> Served {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("oncely.db").display());
        let store = oncely_store::open(&url, StoreOptions::default())
            .await
            .unwrap();
        let guard = Arc::new(Guard::new(store, b"it key".to_vec()));
        let orders = Arc::new(AtomicUsize::new(0));
        let app = example::app(guard.clone(), orders.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Served {
            addr,
            orders,
            guard,
            client: Client::builder(TokioExecutor::new()).build_http(),
            _dir: dir,
        }
    }

    /// Posts `body` to `/v1/orders`: the status, `Oncely-Status` and the body.
    async fn order(&self, body: &str) -> (StatusCode, String, serde_json::Value) {
        let req = http::Request::post(format!("http://{}/v1/orders", self.addr))
            .header("authorization", "Bearer sk_agent")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let res = self.client.request(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let oncely = parts
            .headers
            .get("oncely-status")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (
            parts.status,
            oncely,
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        )
    }
}

#[tokio::test]
async fn a_key_from_a_json_field_places_each_order_once() {
    let s = Served::start().await;
    let tea = r#"{"request_id":"r-1","item":"tea"}"#;
    let (status, oncely, first) = s.order(tea).await;
    assert_eq!((status, oncely.as_str()), (StatusCode::OK, "fresh"));
    s.guard.drain().await;
    let (status, oncely, again) = s.order(tea).await;
    assert_eq!((status, oncely.as_str()), (StatusCode::OK, "replayed"));
    assert_eq!(again, first, "the first answer, replayed");
    assert_eq!(s.orders.load(Ordering::SeqCst), 1, "one order placed");

    // Another value of the field is another intention.
    let (status, oncely, other) = s.order(r#"{"request_id":"r-2","item":"tea"}"#).await;
    assert_eq!((status, oncely.as_str()), (StatusCode::OK, "fresh"));
    assert_eq!(other["order"], 2);
    assert_eq!(s.orders.load(Ordering::SeqCst), 2, "two orders placed");

    // The same key with another body is refused, and a body without one too.
    let (status, oncely, _) = s.order(r#"{"request_id":"r-1","item":"coffee"}"#).await;
    assert_eq!(
        (status, oncely.as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "key_reused")
    );
    let (status, oncely, problem) = s.order(r#"{"item":"tea"}"#).await;
    assert_eq!(
        (status, oncely.as_str()),
        (StatusCode::BAD_REQUEST, "key_missing")
    );
    assert_eq!(problem["code"], "key_missing");
    let (status, oncely, _) = s.order(r#"{"request_id":7}"#).await;
    assert_eq!(
        (status, oncely.as_str()),
        (StatusCode::BAD_REQUEST, "key_invalid")
    );
    assert_eq!(s.orders.load(Ordering::SeqCst), 2, "no more orders placed");
}

#[tokio::test]
async fn concurrent_callers_with_one_json_key_place_one_order() {
    let s = Arc::new(Served::start().await);
    let calls = (0..16).map(|_| {
        let s = s.clone();
        tokio::spawn(async move { s.order(r#"{"request_id":"r-9","item":"tea"}"#).await })
    });
    let answers = futures::future::join_all(calls).await;
    let mut fresh = 0;
    for answer in answers {
        let (status, oncely, body) = answer.unwrap();
        assert_eq!(status, StatusCode::OK, "{oncely} {body}");
        assert_eq!(body["order"], 1);
        fresh += usize::from(oncely == "fresh");
        assert!(
            ["fresh", "joined", "replayed"].contains(&oncely.as_str()),
            "{oncely}"
        );
    }
    assert_eq!(fresh, 1);
    s.guard.drain().await;
    assert_eq!(s.orders.load(Ordering::SeqCst), 1, "one order placed");
}
