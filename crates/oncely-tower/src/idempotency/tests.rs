//! The layer's behaviour, one contract rule a test, with `service_fn` and `oneshot` (no
//! sockets) on the memory store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use oncely_core::{
    ClaimSpec, Class, Completion, DownstreamKey, Fence, Identity, Record, RecordId, Resolution,
    Scope, State, TakeOverOutcome, Timestamp,
};
use oncely_store::memory::MemoryStore;
use oncely_store::{
    Admin, Claim, Ledger, ListFilter, ManualClock, StoreError, TaskQueue, Usage, Waiting,
};
use tower::{service_fn, Layer, ServiceExt};

use crate::body::full;
use crate::{
    BoxBody, BoxError, Guard, GuardWhen, IdempotencyLayer, KeyMode, PrincipalSource, RoutePolicy,
    UnitsRule, UpstreamError,
};

type Reply = Result<Response<BoxBody>, BoxError>;
type Behaviour = Arc<dyn Fn(usize, &http::request::Parts, &Bytes) -> Reply + Send + Sync>;

/// A fake upstream service that counts its executions and remembers the
/// `Idempotency-Key` it was sent.
#[derive(Clone)]
struct FakeUpstream {
    calls: Arc<AtomicUsize>,
    keys: Arc<Mutex<Vec<String>>>,
    delay: Duration,
    behaviour: Behaviour,
}

impl FakeUpstream {
    /// Answers 200 `run N: BODY`.
    fn echo() -> FakeUpstream {
        FakeUpstream::with(|n, _, body| {
            let text = format!("run {n}: {}", String::from_utf8_lossy(body));
            Ok(Response::builder()
                .header("content-type", "text/plain")
                .header("x-request-id", format!("req-{n}"))
                .body(full(text))
                .unwrap())
        })
    }

    fn with(
        f: impl Fn(usize, &http::request::Parts, &Bytes) -> Reply + Send + Sync + 'static,
    ) -> FakeUpstream {
        FakeUpstream {
            calls: Arc::default(),
            keys: Arc::default(),
            delay: Duration::ZERO,
            behaviour: Arc::new(f),
        }
    }

    fn delayed(mut self, delay: Duration) -> FakeUpstream {
        self.delay = delay;
        self
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl tower::Service<
        Request<BoxBody>,
        Response = Response<BoxBody>,
        Error = BoxError,
        Future = impl Send,
    > + Clone
           + Send
           + 'static {
        let me = self.clone();
        service_fn(move |req: Request<BoxBody>| {
            let me = me.clone();
            async move {
                let n = me.calls.fetch_add(1, Ordering::SeqCst) + 1;
                let (parts, body) = req.into_parts();
                if let Some(k) = parts.headers.get("idempotency-key") {
                    me.keys
                        .lock()
                        .unwrap()
                        .push(k.to_str().unwrap().to_string());
                }
                let body = body.collect().await?.to_bytes();
                tokio::time::sleep(me.delay).await;
                (me.behaviour)(n, &parts, &body)
            }
        })
    }
}

struct Setup {
    guard: Arc<Guard>,
    store: Arc<MemoryStore>,
    clock: ManualClock,
}

fn setup() -> Setup {
    let clock = ManualClock::new();
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let guard = Arc::new(Guard::new(store.clone(), b"test key".to_vec()));
    Setup {
        guard,
        store,
        clock,
    }
}

fn policy(class: Class) -> RoutePolicy {
    let mut p = RoutePolicy::new("POST /r", class);
    p.wait = Duration::from_secs(5);
    p
}

type Svc = crate::IdempotencyService<
    tower::util::BoxCloneService<Request<BoxBody>, Response<BoxBody>, BoxError>,
    Arc<dyn crate::RoutePolicies>,
>;

impl crate::RoutePolicies for Arc<dyn crate::RoutePolicies> {
    fn policy(&self, method: &Method, path: &str) -> Option<Arc<RoutePolicy>> {
        (**self).policy(method, path)
    }
}

/// The layer over `upstream`, guarding `/r` (any method) with `policy`; `/open` is
/// not a guarded route.
fn layer(s: &Setup, policy: RoutePolicy, upstream: &FakeUpstream) -> Svc {
    let policy = Arc::new(policy);
    let routes: Arc<dyn crate::RoutePolicies> =
        Arc::new(move |_: &Method, path: &str| (path == "/r").then(|| policy.clone()));
    IdempotencyLayer::new(s.guard.clone(), routes)
        .layer(tower::util::BoxCloneService::new(upstream.service()))
}

fn req(body: &str, key: Option<&str>, principal: Option<&str>) -> Request<BoxBody> {
    let mut b = Request::post("/r");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    if let Some(p) = principal {
        b = b.header("authorization", p);
    }
    b.body(full(body.to_string())).unwrap()
}

/// One request, answered in full. (Not `Send`: a future holding a `Request<BoxBody>`
/// across an await meets rust-lang/rust#64552, so concurrent tests use `join!`.)
async fn send(svc: &Svc, r: Request<BoxBody>) -> (StatusCode, http::HeaderMap, String) {
    let res = svc.clone().oneshot(r).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn status(h: &http::HeaderMap) -> &str {
    h.get("oncely-status")
        .map(|v| v.to_str().unwrap())
        .unwrap_or("")
}

fn code(body: &str) -> String {
    let doc: serde_json::Value = serde_json::from_str(body).expect("problem+json");
    doc["code"].as_str().unwrap().to_string()
}

const ALICE: Option<&str> = Some("Bearer sk_alice");
const BOB: Option<&str> = Some("Bearer sk_bob");

#[tokio::test]
async fn fresh_then_replayed_with_headers_and_one_execution() {
    let s = setup();
    let up = FakeUpstream::echo();
    let svc = layer(&s, policy(Class::Write), &up);

    let (st, h, body) = send(&svc, req("hello", Some("k1"), ALICE)).await;
    assert_eq!(st, 200);
    assert_eq!(status(&h), "fresh");
    assert_eq!(body, "run 1: hello");
    assert!(h.get("idempotent-replayed").is_none());
    let id = h["oncely-record"].to_str().unwrap().to_string();

    let (st, h2, body2) = send(&svc, req("hello", Some("k1"), ALICE)).await;
    assert_eq!(st, 200);
    assert_eq!(status(&h2), "replayed");
    assert_eq!(h2["idempotent-replayed"], "true");
    assert_eq!(h2["oncely-record"], id.as_str());
    assert_eq!(h2["content-type"], "text/plain");
    assert_eq!(body2, "run 1: hello");
    assert_eq!(up.calls(), 1);

    s.guard.drain().await;
    let r = s.store.get(&RecordId(id)).await.unwrap().unwrap();
    assert_eq!(r.state, State::Completed);
    assert_eq!(r.repeats, 1);
    assert_eq!(r.provider_request_id.as_deref(), Some("req-1"));
}

#[tokio::test]
async fn the_upstream_gets_the_downstream_key_not_the_clients() {
    let s = setup();
    let up = FakeUpstream::echo();
    let svc = layer(&s, policy(Class::Write), &up);
    send(&svc, req("x", Some("client-key"), ALICE)).await;
    let principal = s.guard.principal_hash(b"Bearer sk_alice");
    let expected = DownstreamKey::derive(&Scope::new(&principal, "POST /r"), "client-key");
    assert_eq!(*up.keys.lock().unwrap(), vec![expected.to_string()]);
}

#[tokio::test]
async fn unguarded_routes_and_reads_are_forwarded_untouched_and_reads_marked_fresh() {
    let s = setup();
    let up = FakeUpstream::echo();
    let svc = layer(&s, policy(Class::Write), &up);
    for _ in 0..2 {
        let r = Request::post("/open")
            .header("idempotency-key", "k")
            .body(full("same"))
            .unwrap();
        let (st, h, _) = send(&svc, r).await;
        assert_eq!(st, 200);
        assert!(h.get("oncely-status").is_none());
        assert!(h.get("oncely-record").is_none());
    }
    assert_eq!(up.calls(), 2);
    assert_eq!(
        *up.keys.lock().unwrap(),
        vec!["k".to_string(), "k".to_string()],
        "the client's key passes through unchanged"
    );

    let read = layer(&s, policy(Class::Read), &up);
    let mut none = policy(Class::Write);
    none.key = Arc::new(KeyMode::None);
    let keyless = layer(&s, none, &up);
    for svc in [&read, &keyless] {
        for _ in 0..2 {
            // Executed every time: marked `fresh`, with no record.
            let (_, h, _) = send(svc, req("same", Some("k"), ALICE)).await;
            assert_eq!(h.get("oncely-status").unwrap(), "fresh");
            assert!(h.get("oncely-record").is_none());
        }
    }
    assert_eq!(up.calls(), 6);
}

#[tokio::test]
async fn key_missing_and_key_invalid() {
    let s = setup();
    let up = FakeUpstream::echo();
    let mut p = policy(Class::Write);
    p.key = Arc::new(KeyMode::Header);
    let svc = layer(&s, p, &up);
    let (st, h, body) = send(&svc, req("x", None, ALICE)).await;
    assert_eq!(st, 400);
    assert_eq!(code(&body), "key_missing");
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(status(&h), "key_missing");

    let svc = layer(&s, policy(Class::Write), &up);
    let long = "k".repeat(256);
    for bad in ["", long.as_str(), "a b", "\"open"] {
        let (st, _, body) = send(&svc, req("x", Some(bad), ALICE)).await;
        assert_eq!(st, 400, "{bad:?}");
        assert_eq!(code(&body), "key_invalid");
    }
    // Two Idempotency-Key lines name no single intention.
    let mut two = req("x", Some("k1"), ALICE);
    two.headers_mut()
        .append("idempotency-key", http::HeaderValue::from_static("k2"));
    let (st, _, body) = send(&svc, two).await;
    assert_eq!(st, 400);
    assert_eq!(code(&body), "key_invalid");
    assert_eq!(up.calls(), 0);
}

/// The built-in key sources read no body: a request refused for its key is refused
/// before its body is read, whatever its size.
#[tokio::test]
async fn a_key_refused_from_the_head_is_refused_before_the_body_is_read() {
    let s = setup();
    let up = FakeUpstream::echo();
    let mut p = policy(Class::Write);
    p.key = Arc::new(KeyMode::Header);
    p.max_body = 8;
    let svc = layer(&s, p, &up);
    let (st, _, body) = send(&svc, req("123456789", None, ALICE)).await;
    assert_eq!(st, 400);
    assert_eq!(code(&body), "key_missing");
    assert_eq!(up.calls(), 0);
}

#[tokio::test]
async fn body_too_large_never_reaches_the_upstream() {
    let s = setup();
    let up = FakeUpstream::echo();
    let mut p = policy(Class::Write);
    p.max_body = 8;
    let svc = layer(&s, p, &up);
    let (st, h, body) = send(&svc, req("123456789", Some("k"), ALICE)).await;
    assert_eq!(st, 413);
    assert_eq!(code(&body), "body_too_large");
    assert_eq!(status(&h), "body_too_large");

    // Without a content-length: a streamed body over the limit.
    let chunks = futures::stream::iter(vec![
        Ok::<_, BoxError>(http_body::Frame::data(Bytes::from_static(b"12345"))),
        Ok(http_body::Frame::data(Bytes::from_static(b"67890"))),
    ]);
    let streamed = BoxBody::new(http_body_util::StreamBody::new(chunks));
    let r = Request::post("/r")
        .header("authorization", "Bearer sk_alice")
        .body(streamed)
        .unwrap();
    let (st, _, body) = send(&svc, r).await;
    assert_eq!(st, 413);
    assert_eq!(code(&body), "body_too_large");

    let (st, _, _) = send(&svc, req("12345678", Some("k"), ALICE)).await;
    assert_eq!(st, 200, "exactly max_body is accepted");
    assert_eq!(up.calls(), 1);
}

#[tokio::test]
async fn key_reused_with_another_body_is_422_and_not_executed() {
    let s = setup();
    let up = FakeUpstream::echo();
    let svc = layer(&s, policy(Class::Write), &up);
    send(&svc, req(r#"{"amount":10}"#, Some("k"), ALICE)).await;
    let (st, h, body) = send(&svc, req(r#"{"amount":99}"#, Some("k"), ALICE)).await;
    assert_eq!(st, 422);
    assert_eq!(code(&body), "key_reused");
    assert!(h.get("oncely-record").is_some());
    assert_eq!(up.calls(), 1);
}

#[tokio::test]
async fn fingerprint_keys_canonicalise_json_and_honour_ignore_fields() {
    let s = setup();
    let up = FakeUpstream::echo();
    let mut p = policy(Class::Write);
    p.key = Arc::new(KeyMode::Fingerprint);
    p.ignore_fields = vec!["/request_id".into()];
    let svc = layer(&s, p, &up);
    let (_, h, _) = send(
        &svc,
        req(r#"{"text":"hi","n":1,"request_id":"a"}"#, None, ALICE),
    )
    .await;
    assert_eq!(status(&h), "fresh");
    let (_, h, body) = send(
        &svc,
        req(
            r#"{ "n": 1.0, "request_id": "b", "text": "hi" }"#,
            None,
            ALICE,
        ),
    )
    .await;
    assert_eq!(status(&h), "replayed", "same intention, other spelling");
    assert!(body.starts_with("run 1:"));
    // In fingerprint mode a client key is ignored.
    let (_, h, _) = send(&svc, req(r#"{"text":"hi","n":1}"#, Some("other"), ALICE)).await;
    assert_eq!(status(&h), "replayed");
    let (_, h, _) = send(&svc, req(r#"{"text":"ho","n":1}"#, None, ALICE)).await;
    assert_eq!(status(&h), "fresh");
    assert_eq!(up.calls(), 2);
}

#[tokio::test]
async fn header_or_fingerprint_uses_the_header_when_present() {
    let s = setup();
    let up = FakeUpstream::echo();
    let svc = layer(&s, policy(Class::Write), &up);
    send(&svc, req("a", None, ALICE)).await;
    let (_, h, _) = send(&svc, req("a", None, ALICE)).await;
    assert_eq!(status(&h), "replayed");
    // The same body under a client key is another intention.
    let (_, h, _) = send(&svc, req("a", Some("k"), ALICE)).await;
    assert_eq!(status(&h), "fresh");
    assert_eq!(up.calls(), 2);
}

#[tokio::test]
async fn fingerprint_headers_count() {
    let s = setup();
    let up = FakeUpstream::echo();
    let mut p = policy(Class::Write);
    p.fingerprint_headers = vec![http::HeaderName::from_static("x-plan")];
    let svc = layer(&s, p, &up);
    let with_plan = |plan: &str| {
        let mut r = req("same", None, ALICE);
        r.headers_mut().insert("x-plan", plan.parse().unwrap());
        r
    };
    send(&svc, with_plan("pro")).await;
    let (_, h, _) = send(&svc, with_plan("free")).await;
    assert_eq!(status(&h), "fresh");
    let (_, h, _) = send(&svc, with_plan("pro")).await;
    assert_eq!(status(&h), "replayed");
}

#[tokio::test]
async fn guard_when_and_missing_principal_bypass() {
    let s = setup();
    let up = FakeUpstream::echo();
    let mut p = policy(Class::Write);
    p.guard_when = Some(GuardWhen {
        header: http::header::AUTHORIZATION,
        prefix: "Bearer sk_".into(),
    });
    let svc = layer(&s, p, &up);
    for _ in 0..2 {
        let (st, h, _) = send(&svc, req("regen", Some("k"), Some("Session web"))).await;
        assert_eq!(st, 200);
        assert_eq!(status(&h), "bypassed");
        assert!(h.get("oncely-record").is_none());
    }
    for _ in 0..2 {
        let (_, h, _) = send(&svc, req("anon", Some("k"), None)).await;
        assert_eq!(status(&h), "bypassed");
    }
    assert_eq!(up.calls(), 4);
    // Without guard_when, a missing principal still bypasses.
    let svc = layer(&s, policy(Class::Write), &up);
    for _ in 0..2 {
        let (_, h, _) = send(&svc, req("anon", Some("k"), None)).await;
        assert_eq!(status(&h), "bypassed");
    }
    assert_eq!(up.calls(), 6);
    let (_, h, _) = send(&svc, req("anon", Some("k"), ALICE)).await;
    assert_eq!(status(&h), "fresh");
}

#[tokio::test]
async fn single_tenant_routes_need_no_principal() {
    let s = setup();
    let up = FakeUpstream::echo();
    let mut p = policy(Class::Write);
    p.principal = Arc::new(PrincipalSource::None);
    let svc = layer(&s, p, &up);
    send(&svc, req("x", Some("k"), None)).await;
    let (_, h, _) = send(&svc, req("x", Some("k"), Some("anyone"))).await;
    assert_eq!(status(&h), "replayed");
}

#[tokio::test]
async fn two_principals_with_one_key_are_isolated() {
    let s = setup();
    let up = FakeUpstream::echo();
    let svc = layer(&s, policy(Class::Write), &up);
    let (_, ha, a) = send(&svc, req("same", Some("k"), ALICE)).await;
    let (_, hb, b) = send(&svc, req("same", Some("k"), BOB)).await;
    assert_eq!(status(&ha), "fresh");
    assert_eq!(status(&hb), "fresh");
    assert_eq!((a.as_str(), b.as_str()), ("run 1: same", "run 2: same"));
    assert_ne!(ha["oncely-record"], hb["oncely-record"]);
    let keys = up.keys.lock().unwrap().clone();
    assert_ne!(keys[0], keys[1], "downstream keys differ per principal");
    let (_, hb2, b2) = send(&svc, req("same", Some("k"), BOB)).await;
    assert_eq!(status(&hb2), "replayed");
    assert_eq!(b2, "run 2: same");
    // The raw principal is never stored.
    let records = s.store.list(&ListFilter::default()).await.unwrap();
    assert!(records.iter().all(|r| !r.principal.contains("sk_")));
    assert_eq!(
        records[0].principal.len(),
        64,
        "HMAC-SHA256 hex: {}",
        records[0].principal
    );
}

#[tokio::test]
async fn replay_window_ends_when_the_upstream_says_so() {
    let s = setup();
    let up = FakeUpstream::with(|n, parts, _| {
        let mut b = Response::builder();
        if parts.uri.query() == Some("seconds") {
            b = b.header("oncely-replay-seconds", "60");
        } else {
            let until = oncely_store::clock::system_now()
                .plus(Duration::from_secs(120))
                .to_rfc3339();
            b = b.header("oncely-replay-until", until);
        }
        Ok(b.body(full(format!("run {n}"))).unwrap())
    });
    let p = policy(Class::Write);
    let policy = Arc::new(p);
    let routes = move |_: &Method, path: &str| (path == "/r").then(|| policy.clone());
    let svc = IdempotencyLayer::new(s.guard.clone(), routes).layer(up.service());
    let call = |q: &'static str| {
        let svc = svc.clone();
        async move {
            let r = Request::post(format!("/r?{q}"))
                .header("authorization", "a")
                .body(full("x"))
                .unwrap();
            let res = svc.oneshot(r).await.unwrap();
            let st = status(res.headers()).to_string();
            let _ = res.into_body().collect().await;
            st
        }
    };
    assert_eq!(call("seconds").await, "fresh");
    assert_eq!(call("until").await, "fresh");
    s.clock.advance(Duration::from_secs(30));
    assert_eq!(call("seconds").await, "replayed");
    assert_eq!(call("until").await, "replayed");
    s.clock.advance(Duration::from_secs(40));
    assert_eq!(call("seconds").await, "fresh", "60 s passed");
    assert_eq!(call("until").await, "replayed");
    s.clock.advance(Duration::from_secs(60));
    assert_eq!(call("until").await, "fresh", "the RFC 3339 time passed");
    assert_eq!(up.calls(), 4);
}

#[tokio::test]
async fn the_window_ends_and_the_next_request_executes_afresh() {
    let s = setup();
    let up = FakeUpstream::echo();
    let mut p = policy(Class::Write);
    p.window = Duration::from_secs(3 * 3600);
    let svc = layer(&s, p, &up);
    send(&svc, req("x", Some("k"), ALICE)).await;
    s.clock.advance(Duration::from_secs(3 * 3600 - 5));
    let (_, h, _) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(status(&h), "replayed");
    s.clock.advance(Duration::from_secs(10));
    let (_, h, _) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(status(&h), "fresh");
    assert_eq!(up.calls(), 2);
}

#[tokio::test]
async fn an_answer_over_max_response_reaches_its_caller_and_is_not_kept() {
    let s = setup();
    let big = "z".repeat(100_000);
    let body = big.clone();
    let up = FakeUpstream::with(move |_, _, _| {
        // Several chunks, as a real upstream would send them.
        let chunks: Vec<Result<http_body::Frame<Bytes>, BoxError>> = body
            .as_bytes()
            .chunks(8192)
            .map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        Ok(Response::new(BoxBody::new(
            http_body_util::StreamBody::new(futures::stream::iter(chunks)),
        )))
    });
    let mut p = policy(Class::Write);
    p.max_response = 10_000;
    let svc = layer(&s, p, &up);
    let (st, h, got) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(st, 200);
    assert_eq!(status(&h), "fresh");
    assert_eq!(got.len(), big.len(), "the caller gets it all");
    let (st, h, body) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(st, 409);
    assert_eq!(code(&body), "result_too_large");
    assert_eq!(status(&h), "result_too_large");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(Timestamp::parse_rfc3339(doc["original_at"].as_str().unwrap()).is_ok());
    assert_eq!(up.calls(), 1);
}

#[tokio::test]
async fn write_failures_release_and_execute_again_with_the_same_downstream_key() {
    let s = setup();
    let up = FakeUpstream::with(|n, _, _| {
        let status = if n == 1 { 500 } else { 201 };
        Ok(Response::builder()
            .status(status)
            .body(full(format!("run {n}")))
            .unwrap())
    });
    let svc = layer(&s, policy(Class::Write), &up);
    let (st, h, _) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(st, 500);
    assert_eq!(status(&h), "fresh");
    let (st, h, body) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(st, 201);
    assert_eq!(status(&h), "fresh");
    assert_eq!(body, "run 2");
    let keys = up.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    let id = RecordId(h["oncely-record"].to_str().unwrap().into());
    assert_eq!(s.store.get(&id).await.unwrap().unwrap().attempt, 2);
}

#[tokio::test]
async fn action_failures_become_outcome_unknown() {
    let s = setup();
    let up = FakeUpstream::with(|_, _, _| {
        Ok(Response::builder().status(500).body(full("boom")).unwrap())
    });
    let svc = layer(&s, policy(Class::Action), &up);
    let (st, h, _) = send(&svc, req("order", Some("k"), ALICE)).await;
    assert_eq!(st, 500, "the original caller gets the upstream's answer");
    assert_eq!(status(&h), "fresh");
    let (st, h, body) = send(&svc, req("order", Some("k"), ALICE)).await;
    assert_eq!(st, 409);
    assert_eq!(code(&body), "outcome_unknown");
    assert_eq!(status(&h), "outcome_unknown");
    assert_eq!(up.calls(), 1);
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_released() {
    let s = setup();
    let up = FakeUpstream::with(|n, _, _| {
        if n == 1 {
            Err(Box::new(UpstreamError::BeforeSend("connection refused".into())) as BoxError)
        } else {
            Ok(Response::new(full("ok")))
        }
    });
    let svc = layer(&s, policy(Class::Action), &up);
    let (st, h, body) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(st, 502);
    assert_eq!(code(&body), "upstream_unreachable");
    assert!(!body.contains("connection refused"), "internals hidden");
    // The gateway's own error: its code, not `fresh`.
    assert_eq!(status(&h), "upstream_unreachable");
    let id = RecordId(h["oncely-record"].to_str().unwrap().into());
    assert_eq!(
        s.store.get(&id).await.unwrap().unwrap().state,
        State::Released
    );
    let (st, _, _) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(
        st, 200,
        "nothing happened, so even an action executes again"
    );
}

#[tokio::test]
async fn an_unknown_inner_error_on_an_action_is_taken_as_lost() {
    let s = setup();
    let up = FakeUpstream::with(|_, _, _| Err("connection reset".into()));
    let svc = layer(&s, policy(Class::Action), &up);
    let (st, _, body) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(st, 502);
    assert_eq!(code(&body), "upstream_unreachable");
    let (st, _, body) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(st, 409);
    assert_eq!(code(&body), "outcome_unknown");
}

#[tokio::test]
async fn upstream_timeout_is_504() {
    let s = setup();
    let up = FakeUpstream::echo().delayed(Duration::from_millis(400));
    let mut p = policy(Class::Write);
    p.timeout = Duration::from_millis(100);
    let svc = layer(&s, p.clone(), &up);
    let (st, h, body) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(st, 504);
    assert_eq!(code(&body), "upstream_timeout");
    let id = RecordId(h["oncely-record"].to_str().unwrap().into());
    assert_eq!(
        s.store.get(&id).await.unwrap().unwrap().state,
        State::Released
    );
    p.class = Class::Action;
    p.name = "POST /action".into();
    let svc = layer(&s, p, &up);
    let (st, h, _) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(st, 504);
    let id = RecordId(h["oncely-record"].to_str().unwrap().into());
    assert_eq!(
        s.store.get(&id).await.unwrap().unwrap().state,
        State::OutcomeUnknown
    );
}

#[tokio::test]
async fn a_duplicate_joins_the_original_in_flight() {
    let s = setup();
    let up = FakeUpstream::echo().delayed(Duration::from_millis(300));
    let svc = layer(&s, policy(Class::Write), &up);
    let first = send(&svc, req("x", Some("k"), ALICE));
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        send(&svc, req("x", Some("k"), ALICE)).await
    };
    let ((_, h1, _), (st, h, body)) = tokio::join!(first, second);
    assert_eq!(st, 200);
    assert_eq!(status(&h), "joined");
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(body, "run 1: x");
    assert_eq!(status(&h1), "fresh");
    assert_eq!(up.calls(), 1);
}

#[tokio::test]
async fn a_duplicate_after_wait_is_in_flight_with_retry_after() {
    let s = setup();
    let up = FakeUpstream::echo().delayed(Duration::from_millis(600));
    let mut p = policy(Class::Write);
    p.wait = Duration::from_millis(100);
    let svc = layer(&s, p, &up);
    let first = send(&svc, req("x", Some("k"), ALICE));
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        send(&svc, req("x", Some("k"), ALICE)).await
    };
    let ((first_status, _, _), (st, h, body)) = tokio::join!(first, second);
    assert_eq!(first_status, 200);
    assert_eq!(st, 409);
    assert_eq!(code(&body), "in_flight");
    assert_eq!(status(&h), "in_flight");
    assert!(h["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    assert!(h.get("oncely-record").is_some());
    assert_eq!(up.calls(), 1);
}

/// A record left processing by a dead owner (lease lapsed) is taken over: a write
/// executes again at attempt 2, an action becomes outcome_unknown.
#[tokio::test]
async fn a_dead_owners_record_is_taken_over() {
    for (class, expect) in [(Class::Write, 200), (Class::Action, 409)] {
        let s = setup();
        let up = FakeUpstream::echo();
        let svc = layer(&s, policy(class), &up);
        let principal = s.guard.principal_hash(b"Bearer sk_alice");
        let body = "x";
        let fingerprint = oncely_core::FingerprintBuilder::new(&principal, "POST", "/r")
            .body(body.as_bytes(), &[]);
        let claim = s
            .store
            .claim(&ClaimSpec {
                identity: Identity::new(
                    principal.clone(),
                    "POST /r".into(),
                    class,
                    Some("k".into()),
                    fingerprint,
                    None,
                ),
                owner: "dead-instance/1".into(),
                lease: Duration::from_secs(30),
            })
            .await
            .unwrap();
        assert!(matches!(claim, Claim::Owned(_)));
        s.clock.advance(Duration::from_secs(31));
        let (st, h, _) = send(&svc, req(body, Some("k"), ALICE)).await;
        assert_eq!(st, expect, "{class}");
        let id = RecordId(h["oncely-record"].to_str().unwrap().into());
        let r = s.store.get(&id).await.unwrap().unwrap();
        match class {
            Class::Write => {
                assert_eq!(status(&h), "fresh");
                assert_eq!(r.attempt, 2);
                assert_eq!(r.state, State::Completed);
                assert_eq!(up.calls(), 1);
            }
            _ => {
                assert_eq!(status(&h), "outcome_unknown");
                assert_eq!(r.state, State::OutcomeUnknown);
                assert_eq!(up.calls(), 0);
            }
        }
    }
}

/// An owner of this instance's is alive while its call runs, whatever the ledger's clock
/// says of its lease (here the store's clock jumps past it, as when a stalled store kept
/// its renewals from landing): a duplicate waits for it and joins, and never takes the
/// record over (an action would become outcome_unknown while it runs, a write run twice).
#[tokio::test]
async fn a_running_owner_of_this_instance_is_never_taken_over() {
    for class in [Class::Action, Class::Write] {
        let s = setup();
        let up = FakeUpstream::echo().delayed(Duration::from_millis(400));
        let svc = layer(&s, policy(class), &up);
        let first = send(&svc, req("x", Some("k"), ALICE));
        let second = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            s.clock.advance(Duration::from_secs(3600));
            send(&svc, req("x", Some("k"), ALICE)).await
        };
        let ((st1, h1, body1), (st, h, body)) = tokio::join!(first, second);
        assert_eq!((st1, status(&h1)), (StatusCode::OK, "fresh"), "{class}");
        assert_eq!(st, 200, "{class}: {body}");
        assert_eq!(status(&h), "joined", "{class}");
        assert_eq!(body, body1);
        assert_eq!(up.calls(), 1, "{class}");
        let id = RecordId(h["oncely-record"].to_str().unwrap().into());
        let r = s.store.get(&id).await.unwrap().unwrap();
        assert_eq!((r.state, r.attempt), (State::Completed, 1), "{class}");
    }
}

#[tokio::test]
async fn units_by_rule() {
    let s = setup();
    let up = FakeUpstream::with(|_, _, _| {
        Ok(Response::builder()
            .header("x-units", "42")
            .body(full("ok"))
            .unwrap())
    });
    let cases = [
        (UnitsRule::None, r#"{"text":"héllo"}"#, 0),
        (UnitsRule::BodyBytes, r#"{"text":"héllo"}"#, 17),
        (UnitsRule::Json("/text".into()), r#"{"text":"héllo"}"#, 5),
        (UnitsRule::Json("/n".into()), r#"{"n":7}"#, 7),
        (UnitsRule::Json("/missing".into()), r#"{"n":7}"#, 0),
        (
            UnitsRule::ResponseHeader(http::HeaderName::from_static("x-units")),
            "{}",
            42,
        ),
    ];
    for (i, (rule, body, units)) in cases.into_iter().enumerate() {
        let mut p = policy(Class::Write);
        p.units = Arc::new(rule.clone());
        p.name = format!("route {i}");
        let svc = layer(&s, p, &up);
        let (_, h, _) = send(&svc, req(body, Some("k"), ALICE)).await;
        send(&svc, req(body, Some("k"), ALICE)).await;
        s.guard.drain().await;
        let id = RecordId(h["oncely-record"].to_str().unwrap().into());
        let r = s.store.get(&id).await.unwrap().unwrap();
        assert_eq!(r.units, units, "{rule:?}");
        assert_eq!((r.repeats, r.repeat_units), (1, units), "{rule:?}");
    }
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_nothing() {
    let s = setup();
    let up = FakeUpstream::echo().delayed(Duration::from_millis(300));
    let svc = layer(&s, policy(Class::Write), &up);
    let gone = tokio::time::timeout(
        Duration::from_millis(100),
        svc.clone().oneshot(req("x", Some("k"), ALICE)),
    )
    .await;
    assert!(gone.is_err(), "the client gave up");
    s.guard.drain().await;
    assert_eq!(s.guard.in_flight(), 0);
    let (_, h, body) = send(&svc, req("x", Some("k"), ALICE)).await;
    assert_eq!(status(&h), "replayed");
    assert_eq!(body, "run 1: x");
    assert_eq!(up.calls(), 1);
}

/// A store whose every call fails as unreachable.
#[derive(Debug)]
struct DownStore;

fn down<T>() -> oncely_store::Result<T> {
    Err(StoreError::Unavailable("connection refused".into()))
}

#[async_trait]
impl Ledger for DownStore {
    async fn claim(&self, _: &ClaimSpec) -> oncely_store::Result<Claim> {
        down()
    }
    async fn complete(&self, _: &Fence, _: Completion) -> oncely_store::Result<Record> {
        down()
    }
    async fn release(
        &self,
        _: &Fence,
        _: Option<String>,
        _: Duration,
    ) -> oncely_store::Result<Record> {
        down()
    }
    async fn mark_unknown(&self, _: &Fence, _: String) -> oncely_store::Result<Record> {
        down()
    }
    async fn renew(&self, _: &Fence, _: Duration) -> oncely_store::Result<()> {
        down()
    }
    async fn take_over(
        &self,
        _: &RecordId,
        _: u32,
        _: &str,
        _: Duration,
    ) -> oncely_store::Result<TakeOverOutcome> {
        down()
    }
    async fn get(&self, _: &RecordId) -> oncely_store::Result<Option<Record>> {
        down()
    }
    async fn lookup(&self, _: &Scope, _: &str) -> oncely_store::Result<Option<Record>> {
        down()
    }
    async fn resolve(&self, _: &RecordId, _: Resolution) -> oncely_store::Result<Record> {
        down()
    }
    async fn record_repeats(
        &self,
        _: &RecordId,
        _: &str,
        _: &str,
        _: &[oncely_store::Repeat],
    ) -> oncely_store::Result<()> {
        down()
    }
    async fn now(&self) -> oncely_store::Result<Timestamp> {
        down()
    }
    async fn ping(&self) -> oncely_store::Result<()> {
        down()
    }
}

#[async_trait]
impl Waiting for DownStore {
    async fn wait_for(&self, _: &RecordId, _: Duration) -> oncely_store::Result<Record> {
        down()
    }
}

#[async_trait]
impl TaskQueue for DownStore {
    async fn claim_with_task(
        &self,
        _: &[ClaimSpec],
        _: Option<Completion>,
        _: oncely_store::NewTask,
    ) -> oncely_store::Result<Claim> {
        down()
    }
    async fn lease_tasks(
        &self,
        _: &str,
        _: &str,
        _: usize,
        _: Duration,
    ) -> oncely_store::Result<Vec<oncely_store::Task>> {
        down()
    }
    async fn lease_tasks_capped(
        &self,
        _: &str,
        _: &str,
        _: usize,
        _: Duration,
    ) -> oncely_store::Result<Vec<oncely_store::Task>> {
        down()
    }
    async fn finish_task(
        &self,
        _: &oncely_store::TaskFence,
        _: oncely_store::TaskOutcome,
    ) -> oncely_store::Result<oncely_store::Finished> {
        down()
    }
    async fn get_task(
        &self,
        _: &oncely_store::TaskId,
    ) -> oncely_store::Result<Option<oncely_store::Task>> {
        down()
    }
    async fn list_tasks(
        &self,
        _: &str,
        _: Option<oncely_store::TaskState>,
    ) -> oncely_store::Result<Vec<oncely_store::Task>> {
        down()
    }
    async fn requeue_task(
        &self,
        _: &oncely_store::TaskId,
    ) -> oncely_store::Result<oncely_store::Task> {
        down()
    }
    async fn task_counts(&self, _: &str) -> oncely_store::Result<oncely_store::TaskCounts> {
        down()
    }
}

#[async_trait]
impl Admin for DownStore {
    async fn purge_usage(&self, _: Timestamp) -> oncely_store::Result<u64> {
        down()
    }
    async fn usage_by_hour(
        &self,
        _: Option<Timestamp>,
    ) -> oncely_store::Result<Vec<oncely_store::UsageHour>> {
        down()
    }
    async fn list(&self, _: &ListFilter) -> oncely_store::Result<Vec<Record>> {
        down()
    }
    async fn purge_step(&self) -> oncely_store::Result<oncely_store::PurgeStep> {
        down()
    }
    async fn usage(&self, _: Option<Timestamp>) -> oncely_store::Result<Usage> {
        down()
    }
    async fn secret(&self, _: &str) -> oncely_store::Result<Vec<u8>> {
        down()
    }
}

#[tokio::test]
async fn store_unavailable_is_503_and_never_forwarded() {
    let guard = Arc::new(Guard::new(Arc::new(DownStore), b"k".to_vec()));
    let up = FakeUpstream::echo();
    let policy = Arc::new(policy(Class::Write));
    let routes = move |_: &Method, path: &str| (path == "/r").then(|| policy.clone());
    let svc = IdempotencyLayer::new(guard, routes).layer(up.service());
    let res = svc.oneshot(req("x", Some("k"), ALICE)).await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["oncely-status"], "store_unavailable");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(code(&body), "store_unavailable");
    assert!(!body.contains("connection refused"), "internals hidden");
    assert_eq!(up.calls(), 0);
}
