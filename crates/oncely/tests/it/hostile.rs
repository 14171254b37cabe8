//! Hostile or careless callers, through the real binary: nothing bypasses, confuses or
//! leaks through the guard. Numbers that differ as decimals are two intentions; every
//! spelling of a guarded path is that path; a caller cannot strip or replace the
//! downstream key; released records expire; a reconciled answer never replays a cookie.
//!
//! Requests go out as raw HTTP/1.1 bytes, so that what is tested is exactly what a
//! client sent (no client library normalises a path or drops a header on the way).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::routing::post;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{run, stderr, stdout, upstream, Gateway};

/// An answer read off the wire.
#[derive(Debug)]
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Sends one request as raw bytes (`Connection: close` added, or put in front of the
/// caller's own `Connection` value) and reads the whole answer.
async fn raw(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Raw {
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\n",
        body.len()
    );
    let mut connection = false;
    for (n, v) in headers {
        if n.eq_ignore_ascii_case("connection") {
            connection = true;
            req.push_str(&format!("{n}: close, {v}\r\n"));
        } else {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
    }
    if !connection {
        req.push_str("connection: close\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no answer head: {}", String::from_utf8_lossy(&out)));
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = out[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Raw {
        status,
        headers,
        body,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[eol + 2..eol + 2 + size]);
        data = &data[eol + 2 + size + 2..];
    }
}

/// An upstream that counts its calls and answers with the path it saw, the
/// `Idempotency-Key` it got and the forwarding headers.
#[derive(Clone, Default)]
struct Seen {
    calls: Arc<AtomicUsize>,
    last: Arc<Mutex<Option<serde_json::Value>>>,
}

fn recording_upstream(seen: Seen, status: StatusCode) -> axum::Router {
    axum::Router::new().fallback(move |req: Request| {
        let seen = seen.clone();
        async move {
            let n = seen.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let h = |name: &str| {
                let all: Vec<&str> = req
                    .headers()
                    .get_all(name)
                    .iter()
                    .map(|v| v.to_str().unwrap_or(""))
                    .collect();
                (!all.is_empty()).then(|| all.join(", "))
            };
            let doc = serde_json::json!({
                "n": n,
                "path": req.uri().path(),
                "query": req.uri().query(),
                "idempotency_key": h("idempotency-key"),
                "forwarded": h("forwarded"),
                "x_forwarded_for": h("x-forwarded-for"),
                "x_forwarded_proto": h("x-forwarded-proto"),
                "connection": h("connection"),
            });
            *seen.last.lock().unwrap() = Some(doc.clone());
            (status, axum::Json(doc))
        }
    })
}

const ALICE: (&str, &str) = ("authorization", "Bearer sk_alice");
const JSON: (&str, &str) = ("content-type", "application/json");

fn sqlite_store(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("ledger.db").display())
}

fn start_with_config(dir: &tempfile::TempDir, toml: &str) -> Gateway {
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(&cfg, toml).unwrap();
    Gateway::start(&["--config", cfg.to_str().unwrap()], &[])
}

/// A gateway with the default route over a recording upstream, on a fresh SQLite ledger.
async fn recorded_gateway() -> (Gateway, Seen, tempfile::TempDir) {
    let seen = Seen::default();
    let up = upstream(recording_upstream(seen.clone(), StatusCode::OK)).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir);
    let gw = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", &store],
        &[],
    );
    (gw, seen, dir)
}

/// Alice's JSON `POST /v1/orders` of `body`, with `key` as its `Idempotency-Key`.
async fn order(addr: SocketAddr, body: &str, key: Option<&str>) -> Raw {
    let mut h = vec![ALICE, JSON];
    if let Some(k) = key {
        h.push(("idempotency-key", k));
    }
    raw(addr, "POST", "/v1/orders", &h, body).await
}

/// Issue 11, item 1: `9007199254740993` and `9007199254740992` are one double but two
/// orders. They get two fingerprints (two executions), and under one key a 422; numbers
/// equal as decimals (`1.0`/`1`, `1e2`/`100`) are still one intention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_that_differ_as_decimals_are_two_intentions() {
    let (gw, seen, _dir) = recorded_gateway().await;
    let send = |body: &'static str, key: Option<&'static str>| order(gw.addr, body, key);

    let a = send(r#"{"id": 9007199254740993}"#, None).await;
    assert_eq!(a.header("oncely-status"), Some("fresh"), "{a:?}");
    let b = send(r#"{"id": 9007199254740992}"#, None).await;
    assert_eq!(b.header("oncely-status"), Some("fresh"), "{b:?}");
    assert_ne!(a.header("oncely-record"), b.header("oncely-record"));
    let amount = send(r#"{"amount": 12345678901234567890.123456789}"#, None).await;
    assert_eq!(amount.header("oncely-status"), Some("fresh"));
    let other_amount = send(r#"{"amount": 12345678901234567890.123456788}"#, None).await;
    assert_eq!(other_amount.header("oncely-status"), Some("fresh"));
    assert_eq!(seen.calls.load(Ordering::SeqCst), 4, "four intentions ran");

    // Equal as decimals: one intention.
    let again = send(r#"{"id": 9007199254740993.0}"#, None).await;
    assert_eq!(again.header("oncely-status"), Some("replayed"));
    assert_eq!(again.header("oncely-record"), a.header("oncely-record"));
    let hundred = send(r#"{"n": 100, "x": 1.0}"#, None).await;
    assert_eq!(hundred.header("oncely-status"), Some("fresh"));
    let respelled = send(r#"{"x": 1, "n": 1e2}"#, None).await;
    assert_eq!(respelled.header("oncely-status"), Some("replayed"));
    assert_eq!(seen.calls.load(Ordering::SeqCst), 5);

    // Under one key, the other number is another request: 422, not the stored answer.
    let keyed = send(r#"{"id": 9007199254740993}"#, Some("order-1")).await;
    assert_eq!(keyed.header("oncely-status"), Some("fresh"));
    let reused = send(r#"{"id": 9007199254740992}"#, Some("order-1")).await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert_eq!(reused.json()["code"], "key_reused");
    assert_eq!(seen.calls.load(Ordering::SeqCst), 6);
}

/// A JSON body that repeats a member name is not canonical JSON (RFC 8785 takes only
/// I-JSON), and upstreams disagree on which value counts: `{"amount":1000,"amount":2}` is
/// hashed as the bytes it is, never taken for `{"amount":2}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_repeats_a_member_name_is_hashed_as_bytes() {
    let (gw, seen, _dir) = recorded_gateway().await;
    let send = |body: &'static str, key: Option<&'static str>| order(gw.addr, body, key);
    let calls = || seen.calls.load(Ordering::SeqCst);

    let plain = send(r#"{"amount": 2}"#, None).await;
    assert_eq!(plain.header("oncely-status"), Some("fresh"), "{plain:?}");
    for (body, runs) in [
        (r#"{"amount":1000,"amount":2}"#, 2),
        (r#"{"amount":2,"amount":1000}"#, 3),
        (r#"{"amount":2,"\u0061mount":2}"#, 4),
    ] {
        let a = send(body, None).await;
        assert_eq!(a.status, 200, "{body}: {a:?}");
        assert_eq!(a.header("oncely-status"), Some("fresh"), "{body}: {a:?}");
        assert_ne!(a.header("oncely-record"), plain.header("oncely-record"));
        assert_eq!(calls(), runs, "{body} ran");
        // The same bytes again are the same intention.
        let again = send(body, None).await;
        assert_eq!(again.header("oncely-status"), Some("replayed"), "{body}");
        assert_eq!(again.header("oncely-record"), a.header("oncely-record"));
        assert_eq!(calls(), runs);
    }
    // Another spelling of it (white space) is other bytes: it runs, it is never taken
    // for the canonical `{"amount":2}`.
    let spaced = send(r#"{"amount": 1000, "amount": 2}"#, None).await;
    assert_eq!(spaced.header("oncely-status"), Some("fresh"));
    assert_eq!(calls(), 5);

    // Under one key: the other request is a 422, not the stored answer.
    let keyed = send(r#"{"amount": 2}"#, Some("order-2")).await;
    assert_eq!(keyed.header("oncely-status"), Some("fresh"));
    let reused = send(r#"{"amount":1000,"amount":2}"#, Some("order-2")).await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert_eq!(reused.json()["code"], "key_reused");
    assert_eq!(calls(), 6);
}

/// A header sent on two lines is one field with both values (RFC 9110): a request whose
/// `fingerprint_headers` field has a second line, or whose principal header has one, is
/// never taken for the request with the first line alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_sent_on_two_lines_counts_with_both_values() {
    let seen = Seen::default();
    let up = upstream(recording_upstream(seen.clone(), StatusCode::OK)).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = start_with_config(
        &dir,
        &format!(
            "upstream = \"http://{up}\"\nstore = \"{}\"\n\n[[routes]]\nmethod = \"POST\"\n\
             path = \"/v1/plan\"\nkey = \"fingerprint\"\nfingerprint_headers = [\"x-plan\"]\n",
            sqlite_store(&dir)
        ),
    );
    let send = |headers: Vec<(&'static str, &'static str)>| {
        let addr = gw.addr;
        async move {
            let mut h = vec![JSON];
            h.extend(headers);
            raw(addr, "POST", "/v1/plan", &h, r#"{"seats":3}"#).await
        }
    };
    let calls = || seen.calls.load(Ordering::SeqCst);

    let two = send(vec![ALICE, ("x-plan", "a"), ("x-plan", "c")]).await;
    assert_eq!(two.header("oncely-status"), Some("fresh"), "{two:?}");
    let first_only = send(vec![ALICE, ("x-plan", "a")]).await;
    assert_eq!(
        first_only.header("oncely-status"),
        Some("fresh"),
        "{first_only:?}"
    );
    assert_ne!(
        first_only.header("oncely-record"),
        two.header("oncely-record")
    );
    assert_eq!(calls(), 2);
    // One line with both values is the same field as two lines.
    let one_line = send(vec![ALICE, ("x-plan", "a, c")]).await;
    assert_eq!(one_line.header("oncely-status"), Some("replayed"));
    assert_eq!(
        one_line.header("oncely-record"),
        two.header("oncely-record")
    );
    assert_eq!(calls(), 2);

    // A second principal line is an account of its own, not the first line's.
    let both = send(vec![
        ALICE,
        ("authorization", "Bearer sk_bob"),
        ("x-plan", "a"),
    ])
    .await;
    assert_eq!(both.header("oncely-status"), Some("fresh"), "{both:?}");
    assert_ne!(
        both.header("oncely-record"),
        first_only.header("oncely-record")
    );
    assert_eq!(calls(), 3);
}

const RENDER_ROUTE: &str = r#"
[[routes]]
method = "POST"
path = "/v1/render"
class = "write"
key = "header-or-fingerprint"
"#;

/// Issue 11, item 2: every spelling of a guarded path is the guarded route, and the
/// upstream sees the one normalised path; what has no unambiguous form is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_spellings_are_one_guarded_route() {
    let seen = Seen::default();
    let up = upstream(recording_upstream(seen.clone(), StatusCode::OK)).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = start_with_config(
        &dir,
        &format!(
            "store = {:?}\nupstream = \"http://{up}\"\n{RENDER_ROUTE}",
            sqlite_store(&dir)
        ),
    );
    let body = r#"{"text":"Chapter one"}"#;
    let first = raw(gw.addr, "POST", "//v1/render", &[ALICE, JSON], body).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("oncely-status"), Some("fresh"));
    assert_eq!(
        first.json()["path"],
        "/v1/render",
        "the upstream sees the normal path"
    );
    for spelling in [
        "/v1/render",
        "/v1/%72ender",
        "/v1/render/",
        "/v1/./render",
        "/v1/x/../render",
        "/v1//render",
        "/v1/%2e/render",
    ] {
        let r = raw(gw.addr, "POST", spelling, &[ALICE, JSON], body).await;
        assert_eq!(
            r.header("oncely-status"),
            Some("replayed"),
            "{spelling}: {r:?}"
        );
        assert_eq!(r.header("oncely-record"), first.header("oncely-record"));
    }
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1, "one execution");

    // A new intention through an odd spelling is guarded and forwarded normalised, with
    // its query as sent.
    let other = raw(
        gw.addr,
        "POST",
        "/v1/x/../%72ender/?voice=ana",
        &[ALICE, JSON],
        r#"{"text":"Chapter two"}"#,
    )
    .await;
    assert_eq!(other.header("oncely-status"), Some("fresh"), "{other:?}");
    assert_eq!(other.json()["path"], "/v1/render");
    assert_eq!(other.json()["query"], "voice=ana");
    assert!(other.json()["idempotency_key"].is_string());

    // No unambiguous form on a guarded method: 400 path_invalid, never forwarded.
    for bad in ["/v1/re%2Fnder", "/v1/%zz", "/v1/render%"] {
        let r = raw(gw.addr, "POST", bad, &[ALICE, JSON], body).await;
        assert_eq!(r.status, 400, "{bad}: {r:?}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(r.json()["code"], "path_invalid", "{bad}");
    }
    assert_eq!(
        seen.calls.load(Ordering::SeqCst),
        2,
        "nothing refused was forwarded"
    );

    // Reads are forwarded on the normalised path too.
    let read = raw(gw.addr, "GET", "/v1/%72ender", &[ALICE], "").await;
    assert_eq!(read.json()["path"], "/v1/render");
    assert!(read.header("oncely-status").is_none());
}

/// Issue 11, item 3: `Connection: idempotency-key` (or naming the forwarding headers)
/// cannot strip oncely's outgoing headers, and a caller's own key never reaches the
/// upstream in place of the derived one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_cannot_strip_or_replace_the_downstream_key() {
    let seen = Seen::default();
    // 503 releases a write, so the same key can run again and show its key twice.
    let up = upstream(recording_upstream(
        seen.clone(),
        StatusCode::SERVICE_UNAVAILABLE,
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let gw = start_with_config(
        &dir,
        &format!(
            "store = {:?}\nupstream = \"http://{up}\"\n{RENDER_ROUTE}",
            sqlite_store(&dir)
        ),
    );
    let body = r#"{"text":"hi"}"#;
    let plain = raw(
        gw.addr,
        "POST",
        "/v1/render",
        &[ALICE, JSON, ("idempotency-key", "mine")],
        body,
    )
    .await;
    assert_eq!(plain.status, 503, "{plain:?}");
    let derived = plain.json()["idempotency_key"].as_str().unwrap().to_owned();
    assert_ne!(
        derived, "mine",
        "the caller's key is not passed on as it is"
    );

    let tricked = raw(
        gw.addr,
        "POST",
        "/v1/render",
        &[
            ALICE,
            JSON,
            ("idempotency-key", "mine"),
            (
                "connection",
                "idempotency-key, forwarded, x-forwarded-for, x-forwarded-proto",
            ),
            ("forwarded", "for=203.0.113.9;proto=https"),
        ],
        body,
    )
    .await;
    assert_eq!(tricked.status, 503, "{tricked:?}");
    let got = tricked.json();
    assert_eq!(got["n"], 2, "the released record ran again");
    assert_eq!(
        got["idempotency_key"], derived,
        "the upstream gets the derived key, not none and not the caller's"
    );
    assert!(got["connection"].is_null(), "{got}");
    assert_eq!(got["x_forwarded_for"], "127.0.0.1");
    assert_eq!(got["x_forwarded_proto"], "http");
    assert_eq!(
        got["forwarded"],
        format!("for=127.0.0.1;proto=http;host={}", gw.addr),
        "the gateway's own Forwarded, not the caller's"
    );
}

/// Issue 11, item 5: a released record (the upstream refused with 401) expires with the
/// route's window: until then a different body under its key is 422; after, it executes
/// afresh; and `ledger purge` removes expired released records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_records_expire_and_are_purged() {
    let seen = Seen::default();
    let up = upstream(recording_upstream(seen.clone(), StatusCode::UNAUTHORIZED)).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir);
    let gw = start_with_config(
        &dir,
        &format!(
            r#"store = {store:?}
upstream = "http://{up}"
[[routes]]
method = "POST"
path = "/v1/render"
class = "write"
window = "2s"
"#
        ),
    );
    let key = |k: &'static str| [ALICE, JSON, ("idempotency-key", k)];
    let denied = raw(gw.addr, "POST", "/v1/render", &key("k1"), r#"{"a":1}"#).await;
    assert_eq!(denied.status, 401);
    for k in ["flood-1", "flood-2", "flood-3"] {
        let r = raw(gw.addr, "POST", "/v1/render", &key(k), r#"{"a":1}"#).await;
        assert_eq!(r.status, 401);
    }
    let reused = raw(gw.addr, "POST", "/v1/render", &key("k1"), r#"{"a":2}"#).await;
    assert_eq!(reused.status, 422, "within the window: {reused:?}");
    assert_eq!(seen.calls.load(Ordering::SeqCst), 4);

    // After the window the key is free: the other body executes.
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let fresh = raw(gw.addr, "POST", "/v1/render", &key("k1"), r#"{"a":2}"#).await;
    assert_eq!(fresh.status, 401, "{fresh:?}");
    assert_eq!(fresh.header("oncely-status"), Some("fresh"));
    assert_eq!(seen.calls.load(Ordering::SeqCst), 5);
    gw.terminate();

    let purge = run(&["ledger", "purge", "--store", &store]);
    assert_eq!(purge.status.code(), Some(0), "{}", stderr(&purge));
    assert!(
        stdout(&purge).contains("purged 3 expired records"),
        "{}",
        stdout(&purge)
    );
    let list = run(&["ledger", "list", "--json", "--store", &store]);
    let list: serde_json::Value = serde_json::from_str(&stdout(&list)).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
}

/// Issue 11, item 9: the answer a reconciler stores is kept by the one header policy:
/// its `Set-Cookie` is never replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciled_answer_is_replayed_without_its_cookie() {
    let posts = Arc::new(AtomicUsize::new(0));
    let counter = posts.clone();
    let up = upstream(
        axum::Router::new().route(
            "/v1/orders",
            post(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_millis(800)).await;
                    "placed"
                }
            })
            .get(|| async {
                (
                    [
                        ("set-cookie", "session=secret; HttpOnly"),
                        ("x-order", "ord_1"),
                    ],
                    r#"{"order":"ord_1"}"#,
                )
            }),
        ),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir);
    let gw = start_with_config(
        &dir,
        &format!(
            r#"store = {store:?}
upstream = "http://{up}"
[[routes]]
method = "POST"
path = "/v1/orders"
class = "action"
timeout = "200ms"
reconcile = "GET /v1/orders?reference={{key}}"
reconcile_after = "1s"
"#
        ),
    );
    let headers = [ALICE, JSON, ("idempotency-key", "order-7")];
    let first = raw(gw.addr, "POST", "/v1/orders", &headers, "{}").await;
    assert_eq!(first.status, 504, "{first:?}");
    let id = first.header("oncely-record").unwrap().to_owned();

    let start = Instant::now();
    let record = loop {
        let o = run(&["ledger", "show", &id, "--json", "--store", &store]);
        let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        if r["state"] == "completed" || start.elapsed() > Duration::from_secs(15) {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    };
    assert_eq!(record["state"], "completed", "{record}");
    assert!(
        !record
            .to_string()
            .to_ascii_lowercase()
            .contains("set-cookie"),
        "not even stored: {record}"
    );
    let again = raw(gw.addr, "POST", "/v1/orders", &headers, "{}").await;
    assert_eq!(again.header("oncely-status"), Some("replayed"), "{again:?}");
    assert_eq!(again.header("x-order"), Some("ord_1"));
    assert_eq!(again.header("set-cookie"), None, "{again:?}");
    assert_eq!(posts.load(Ordering::SeqCst), 1);
}
