//! Real parts for the ingress tests: stores on SQLite files and PostgreSQL schemas, a
//! recording handler on 127.0.0.1, the gateway's router on 127.0.0.1, and signed
//! deliveries.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oncely_store::{Store, StoreOptions};
use oncely_store_conformance::testing::{fresh_pg_schema, shared_pg_url};
use oncely_webhooks::{
    sign, DeliveryWorker, Scheme, Secrets, Verifier, WebhookConfig, WebhookEndpoint, WorkerOptions,
};

pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Where a test's ledger lives.
pub(crate) enum Backend {
    Sqlite(tempfile::TempDir),
    Postgres(String),
}

impl Backend {
    pub(crate) fn sqlite() -> Backend {
        Backend::Sqlite(tempfile::tempdir().unwrap())
    }

    pub(crate) async fn postgres() -> Backend {
        Backend::Postgres(fresh_pg_schema(&shared_pg_url()).await)
    }

    /// Drops the ledger's schema (PostgreSQL only): every later statement fails.
    pub(crate) async fn break_schema(&self) {
        let Backend::Postgres(url) = self else {
            panic!("break_schema needs PostgreSQL")
        };
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute("DROP TABLE IF EXISTS tasks, records CASCADE")
            .await
            .unwrap();
    }

    /// A store instance (each call: its own connections, like another process).
    pub(crate) async fn open(&self) -> Arc<dyn Store> {
        match self {
            Backend::Sqlite(dir) => {
                let path = dir.path().join("ledger.db");
                oncely_store::open(
                    &format!("sqlite://{}", path.display()),
                    StoreOptions::default(),
                )
                .await
                .unwrap()
            }
            Backend::Postgres(url) => oncely_store::open(url, StoreOptions::default())
                .await
                .unwrap(),
        }
    }
}

/// What the handler does with a request.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Answer {
    Status(u16),
    /// Sleeps, then answers 200.
    Slow(Duration),
}

/// One request the handler received.
#[derive(Clone, Debug)]
pub(crate) struct Received {
    pub(crate) key: Option<String>,
    pub(crate) content_type: Option<String>,
    pub(crate) body: Bytes,
}

#[derive(Default)]
struct HandlerState {
    received: Vec<Received>,
    script: Vec<Answer>,
    otherwise: Option<Answer>,
    in_flight: HashSet<String>,
    overlaps: Vec<String>,
}

/// A real HTTP handler on 127.0.0.1 that records what it receives and answers from a
/// script (then `otherwise`, default 200).
#[derive(Clone)]
pub(crate) struct Handler {
    state: Arc<Mutex<HandlerState>>,
    pub(crate) addr: SocketAddr,
}

impl Handler {
    pub(crate) async fn start(script: Vec<Answer>, otherwise: Answer) -> Handler {
        let state = Arc::new(Mutex::new(HandlerState {
            script,
            otherwise: Some(otherwise),
            ..HandlerState::default()
        }));
        let app = Router::new()
            .route("/hook", axum::routing::post(handle))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Handler { state, addr }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    pub(crate) fn overlaps(&self) -> Vec<String> {
        self.state.lock().unwrap().overlaps.clone()
    }

    pub(crate) fn answer_from_now(&self, answer: Answer) {
        let mut s = self.state.lock().unwrap();
        s.script.clear();
        s.otherwise = Some(answer);
    }

    /// Waits until the handler received `n` requests (panics after `within`).
    pub(crate) async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        let start = Instant::now();
        loop {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            assert!(
                start.elapsed() < within,
                "the handler received {} of {n} requests within {within:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn handle(
    State(state): State<Arc<Mutex<HandlerState>>>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let answer = {
        let mut s = state.lock().unwrap();
        s.received.push(Received {
            key: key.clone(),
            content_type: headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body,
        });
        if let Some(k) = &key {
            if !s.in_flight.insert(k.clone()) {
                s.overlaps.push(k.clone());
            }
        }
        if s.script.is_empty() {
            s.otherwise.unwrap_or(Answer::Status(200))
        } else {
            s.script.remove(0)
        }
    };
    let status = match answer {
        Answer::Status(code) => code,
        Answer::Slow(d) => {
            tokio::time::sleep(d).await;
            200
        }
    };
    if let Some(k) = &key {
        state.lock().unwrap().in_flight.remove(k);
    }
    (StatusCode::from_u16(status).unwrap(), "ok").into_response()
}

pub(crate) fn scheme() -> Scheme {
    "standard".parse().unwrap()
}

pub(crate) fn verifier() -> Verifier {
    let scheme = scheme();
    let secrets = Secrets::parse(&scheme, SECRET).unwrap();
    Verifier::new(scheme, secrets, Duration::from_secs(300))
}

pub(crate) fn config(deliver_to: &str) -> WebhookConfig {
    let mut c = WebhookConfig::new("/hooks/standard", verifier(), deliver_to);
    c.retry_backoff = Duration::from_millis(10);
    c.deliver_timeout = Duration::from_secs(5);
    c.max_attempts = 5;
    c.max_body = 64 * 1024;
    c
}

pub(crate) fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The headers of a delivery of `body` signed as `event_id` at `timestamp`.
pub(crate) fn signed(event_id: &str, timestamp: i64, body: &[u8]) -> Vec<(String, String)> {
    let scheme = scheme();
    let secrets = Secrets::parse(&scheme, SECRET).unwrap();
    let mut headers = sign(&scheme, secrets.primary(), event_id, timestamp, body);
    headers.push((
        "content-type".into(),
        "application/json; charset=utf-8".into(),
    ));
    headers
}

/// The gateway: the endpoint's router on 127.0.0.1, and a client for it.
pub(crate) struct Gateway {
    pub(crate) addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

pub(crate) struct Answered {
    pub(crate) status: u16,
    pub(crate) oncely_status: Option<String>,
    pub(crate) record: Option<String>,
    pub(crate) content_type: Option<String>,
    pub(crate) json: serde_json::Value,
}

impl Gateway {
    pub(crate) async fn start(router: Router) -> Gateway {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Gateway {
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub(crate) async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
    ) -> Answered {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (n, v) in headers {
            req = req.header(n, v);
        }
        let res = self
            .client
            .request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap();
        let header = |n: &str| {
            res.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (status, oncely_status, record, content_type) = (
            res.status().as_u16(),
            header("oncely-status"),
            header("oncely-record"),
            header("content-type"),
        );
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        Answered {
            status,
            oncely_status,
            record,
            content_type,
            json: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        }
    }

    pub(crate) async fn post(&self, headers: &[(String, String)], body: &[u8]) -> Answered {
        self.send("POST", "/hooks/standard", headers, body.to_vec())
            .await
    }
}

/// A gateway with one endpoint (woken worker optional) on `store`.
pub(crate) async fn gateway(
    store: Arc<dyn Store>,
    config: WebhookConfig,
    worker: Option<&DeliveryWorker>,
) -> Gateway {
    let mut endpoint = WebhookEndpoint::new(config, store);
    if let Some(w) = worker {
        endpoint = endpoint.with_waker(w.waker());
    }
    Gateway::start(endpoint.router()).await
}

pub(crate) fn worker(store: Arc<dyn Store>, name: &str, lease: Duration) -> DeliveryWorker {
    DeliveryWorker::start(
        store,
        WorkerOptions {
            owner: name.into(),
            concurrency: 4,
            lease,
            poll_interval: Duration::from_millis(50),
            drain_timeout: Duration::from_secs(5),
            spans: None,
        },
    )
}
