//! A test gateway: an axum app whose handlers are the "upstream", wrapped in the
//! idempotency layer, served on port 0, with a hyper client in front.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use oncely_core::Class;
use oncely_store::{Store, StoreOptions};
use oncely_tower::{Guard, IdempotencyLayer, KeyMode, RoutePolicy, UnitsRule};

/// What the upstream saw.
#[derive(Default)]
pub(crate) struct Upstream {
    calls: Mutex<HashMap<String, usize>>,
    pub(crate) keys: Mutex<Vec<String>>,
    pub(crate) finished: AtomicUsize,
}

impl Upstream {
    pub(crate) fn calls(&self, path: &str) -> usize {
        self.calls.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

pub(crate) struct Gateway {
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) guard: Arc<Guard>,
    pub(crate) store: Arc<dyn Store>,
    client: Client<HttpConnector, Full<Bytes>>,
    _dir: tempfile::TempDir,
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn oncely(&self) -> &str {
        self.headers
            .get("oncely-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub(crate) fn record(&self) -> oncely_core::RecordId {
        oncely_core::RecordId(self.headers["oncely-record"].to_str().unwrap().to_string())
    }

    pub(crate) fn code(&self) -> String {
        let doc: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        doc["code"].as_str().unwrap().to_string()
    }
}

/// The upstream's handler: counts, sleeps `x-delay-ms`, and answers per path.
async fn upstream(
    State(up): State<Arc<Upstream>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let n = {
        let mut calls = up.calls.lock().unwrap();
        let n = calls.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    if let Some(k) = headers.get("idempotency-key") {
        up.keys
            .lock()
            .unwrap()
            .push(k.to_str().unwrap().to_string());
    }
    let delay = headers
        .get("x-delay-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    up.finished.fetch_add(1, Ordering::SeqCst);
    let text = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["text"].as_str().map(str::to_string))
        .unwrap_or_default();
    match path.as_str() {
        // Fails on the first call, succeeds after.
        "/v1/flaky" | "/v1/order" if n == 1 => {
            (StatusCode::INTERNAL_SERVER_ERROR, "upstream broke").into_response()
        }
        _ => (
            StatusCode::CREATED,
            [
                ("content-type", "application/json"),
                ("request-id", "prov-1"),
            ],
            serde_json::json!({"run": n, "audio": format!("audio of {text}")}).to_string(),
        )
            .into_response(),
    }
}

fn routes() -> impl oncely_tower::RoutePolicies {
    let mut table: HashMap<&'static str, Arc<RoutePolicy>> = HashMap::new();
    let base = |name: &str, class: Class| {
        let mut p = RoutePolicy::new(name, class);
        p.wait = Duration::from_secs(10);
        p.lease = Duration::from_secs(3);
        p
    };
    let mut render = base("POST /v1/render", Class::Write);
    render.key = Arc::new(KeyMode::Fingerprint);
    render.units = Arc::new(UnitsRule::Json("/text".into()));
    table.insert("/v1/render", Arc::new(render));
    let mut short_wait = base("POST /v1/short-wait", Class::Write);
    short_wait.wait = Duration::from_millis(200);
    table.insert("/v1/short-wait", Arc::new(short_wait));
    table.insert("/v1/flaky", Arc::new(base("POST /v1/flaky", Class::Write)));
    table.insert("/v1/order", Arc::new(base("POST /v1/order", Class::Action)));
    let mut slow = base("POST /v1/slow", Class::Action);
    slow.timeout = Duration::from_millis(300);
    table.insert("/v1/slow", Arc::new(slow));
    move |m: &Method, path: &str| {
        if m != Method::POST {
            return None;
        }
        table.get(path).cloned()
    }
}

impl Gateway {
    pub(crate) async fn start() -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("oncely.db").display());
        let store = oncely_store::open(&url, StoreOptions::default())
            .await
            .unwrap();
        let guard = Arc::new(Guard::new(store.clone(), b"it key".to_vec()));
        let up = Arc::new(Upstream::default());
        let app = Router::new()
            .route("/{*path}", post(upstream))
            .with_state(up.clone())
            .layer(IdempotencyLayer::new(guard.clone(), routes()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let client = Client::builder(TokioExecutor::new()).build_http();
        Gateway {
            addr,
            upstream: up,
            guard,
            store,
            client,
            _dir: dir,
        }
    }

    pub(crate) fn request(&self, path: &str, body: &str) -> RequestBuilder<'_> {
        RequestBuilder {
            gateway: self,
            req: http::Request::post(format!("http://{}{path}", self.addr))
                .header("authorization", "Bearer sk_agent")
                .header("content-type", "application/json"),
            body: body.to_string(),
        }
    }
}

pub(crate) struct RequestBuilder<'a> {
    gateway: &'a Gateway,
    req: http::request::Builder,
    body: String,
}

impl RequestBuilder<'_> {
    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.req = self.req.header(name, value);
        self
    }

    pub(crate) async fn send(self) -> Answer {
        let req = self.req.body(Full::new(Bytes::from(self.body))).unwrap();
        let res = self.gateway.client.request(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }
}
