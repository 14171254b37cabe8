//! Edges that need no SDK: a result over `max_response`, `tools/call` inside a JSON-RPC
//! batch (2025-03-26), and an `https://` upstream. The upstream is a small JSON-RPC
//! server on 127.0.0.1 (plain or TLS with a test CA) that counts what it executes.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use oncely_mcp::{McpConfig, McpEndpoint};
use serde_json::{json, Value};

use crate::harness::Gateway;

/// Executions of `tools/call`, by the upstream's count, and the headers of every request
/// it received.
#[derive(Clone, Default)]
struct Counter(
    Arc<AtomicUsize>,
    Arc<std::sync::Mutex<Vec<http::HeaderMap>>>,
);

fn answer(message: &Value, counter: &Counter) -> Option<Value> {
    let id = message.get("id")?.clone();
    let result = match message["method"].as_str()? {
        "tools/list" => json!({"tools": [
            {"name": "count", "inputSchema": {"type": "object"}},
            {"name": "big", "inputSchema": {"type": "object"}}
        ]}),
        "tools/call" => {
            let n = counter.0.fetch_add(1, Ordering::SeqCst) + 1;
            let text = match message["params"]["name"].as_str() {
                Some("big") => format!("{} (run #{n})", "x".repeat(5000)),
                _ => format!("count run #{n}"),
            };
            json!({"content": [{"type": "text", "text": text}]})
        }
        _ => json!({}),
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

async fn serve_one(
    req: Request<Incoming>,
    counter: Counter,
) -> Result<Response<Full<Bytes>>, Infallible> {
    counter.1.lock().unwrap().push(req.headers().clone());
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let out = match &message {
        Value::Array(items) => {
            Value::Array(items.iter().filter_map(|m| answer(m, &counter)).collect())
        }
        m => answer(m, &counter).unwrap_or(Value::Null),
    };
    let mut resp = Response::new(Full::new(Bytes::from(out.to_string())));
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}

/// Starts the upstream, over TLS when `tls` is given; returns its base URL.
async fn upstream(counter: Counter, tls: Option<Arc<rustls::ServerConfig>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |r| serve_one(r, counter.clone()));
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match acceptor {
                    Some(a) => {
                        if let Ok(s) = a.accept(stream).await {
                            let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                        }
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                    }
                }
            });
        }
    });
    format!("{scheme}://127.0.0.1:{}/mcp", addr.port())
}

async fn post(url: &str, body: Value) -> (http::StatusCode, Value) {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    let req = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", "Bearer sk_edge")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn call(id: i64, tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": {"n": 1}}})
}

fn replay_status(message: &Value) -> Option<&str> {
    message["result"]["_meta"]["dev.oncely/replay"]["status"].as_str()
}

#[tokio::test]
async fn a_result_over_max_response_reaches_its_caller_and_is_never_run_again() {
    let counter = Counter::default();
    let url = upstream(counter.clone(), None).await;
    let mut config = McpConfig::new("/mcp", &url).unwrap();
    config.max_response = 1000;
    let gw = Gateway::start(config).await;

    let (_, first) = post(&gw.url, call(1, "big")).await;
    let text = first["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.len() > 5000 && text.ends_with("(run #1)"),
        "the caller gets it whole"
    );
    gw.guard.drain().await;

    let (status, again) = post(&gw.url, call(2, "big")).await;
    assert_eq!(status, 200);
    assert_eq!(again["id"], 2);
    assert_eq!(again["result"]["isError"], true, "{again}");
    assert_eq!(replay_status(&again), Some("result_too_large"));
    let text = again["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("too large") || text.contains("larger than the gateway keeps"),
        "{text}"
    );
    assert!(text.contains("will not run again"), "{text}");
    assert_eq!(counter.0.load(Ordering::SeqCst), 1, "not executed again");

    let records = gw.store.list(&Default::default()).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].state, oncely_core::State::Completed);
    assert_eq!(records[0].response.as_ref().unwrap().body, None);
}

#[tokio::test]
async fn headers_that_cross_one_hop_are_not_forwarded_including_those_connection_names() {
    let counter = Counter::default();
    let url = upstream(counter.clone(), None).await;
    let gw = Gateway::start(McpConfig::new("/mcp", &url).unwrap()).await;

    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    for message in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        call(2, "count"),
    ] {
        let req = Request::post(&gw.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", "Bearer sk_edge")
            .header("connection", "keep-alive, x-connection-only")
            .header("x-connection-only", "1")
            .header("proxy-authorization", "Basic c2VjcmV0")
            .header("x-end-to-end", "kept")
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap();
    }
    let seen = counter.1.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "both reached the upstream");
    for headers in seen {
        assert_eq!(headers["x-end-to-end"], "kept", "{headers:?}");
        assert!(headers.get("x-connection-only").is_none(), "{headers:?}");
        assert!(headers.get("proxy-authorization").is_none(), "{headers:?}");
    }
    assert_eq!(counter.0.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_tools_call_inside_a_batch_is_guarded() {
    let counter = Counter::default();
    let url = upstream(counter.clone(), None).await;
    let gw = Gateway::start(McpConfig::new("/mcp", &url).unwrap()).await;

    let batch = |a: i64, b: i64| {
        json!([call(a, "count"), {"jsonrpc": "2.0", "id": b, "method": "tools/list"},
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}}])
    };
    let (status, first) = post(&gw.url, batch(1, 2)).await;
    assert_eq!(status, 200);
    let first = first.as_array().unwrap().clone();
    assert_eq!(first.len(), 2, "one response per request: {first:?}");
    let by_id = |msgs: &[Value], id: i64| msgs.iter().find(|m| m["id"] == id).cloned().unwrap();
    assert!(
        by_id(&first, 2)["result"]["tools"].is_array(),
        "the rest is forwarded"
    );
    let ran = by_id(&first, 1);
    assert_eq!(ran["result"]["content"][0]["text"], "count run #1");
    assert_eq!(replay_status(&ran), None);
    gw.guard.drain().await;

    let (_, second) = post(&gw.url, batch(3, 4)).await;
    let second = second.as_array().unwrap().clone();
    let repeat = by_id(&second, 3);
    assert_eq!(repeat["result"]["content"][0]["text"], "count run #1");
    assert_eq!(replay_status(&repeat), Some("replayed"));
    // A repeat alone, and as a single message, is the same intention.
    let (_, single) = post(&gw.url, call(5, "count")).await;
    assert_eq!(replay_status(&single), Some("replayed"));
    assert_eq!(
        counter.0.load(Ordering::SeqCst),
        1,
        "the batch's tools/call ran once"
    );
}

#[tokio::test]
async fn an_https_upstream_is_verified_with_the_configured_ca() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let counter = Counter::default();
    let url = upstream(counter.clone(), Some(pki.server_config())).await;
    assert!(url.starts_with("https://"));

    // Without the CA the certificate is refused and nothing runs.
    let gw = Gateway::start(McpConfig::new("/mcp", &url).unwrap()).await;
    let (status, _) = post(&gw.url, call(1, "count")).await;
    assert_eq!(status, 502, "an unknown CA is refused");
    drop(gw);

    let client = McpEndpoint::direct(Some(&ca)).unwrap();
    let gw = Gateway::start_with_client(McpConfig::new("/mcp", &url).unwrap(), client).await;
    let (status, first) = post(&gw.url, call(2, "count")).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["result"]["content"][0]["text"], "count run #1");
    gw.guard.drain().await;
    let (_, again) = post(&gw.url, call(3, "count")).await;
    assert_eq!(replay_status(&again), Some("replayed"));
    assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    assert!(McpEndpoint::direct(Some(&dir.path().join("missing.pem"))).is_err());
}

/// A test CA and a certificate for 127.0.0.1 it signed.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "oncely-mcp test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
        Pki {
            ca_pem: ca.pem(),
            cert_pem: leaf.pem(),
            key_pem: leaf_key.serialize_pem(),
        }
    }

    fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let certs = rustls_pemfile::certs(&mut self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls_pemfile::private_key(&mut self.key_pem.as_bytes())
            .unwrap()
            .unwrap();
        let mut c = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(c)
    }
}

/// A principal source of one's own (the `x-account` header) and the built-in units rule
/// `json:/text` are the layer's extension points on an MCP endpoint too: the account
/// scopes the replay, its absence forwards the call unguarded, and the units are counted
/// from the call's `arguments`.
#[tokio::test]
async fn mcp_principal_and_units_are_the_layers_extension_points() {
    #[derive(Debug)]
    struct AccountHeader;
    impl oncely_tower::MakePrincipal for AccountHeader {
        fn make_principal<'a>(
            &self,
            head: &oncely_tower::RequestHead<'a>,
        ) -> Option<std::borrow::Cow<'a, [u8]>> {
            head.headers
                .get("x-account")
                .map(|v| std::borrow::Cow::Borrowed(v.as_bytes()))
        }
    }
    let counter = Counter::default();
    let url = upstream(counter.clone(), None).await;
    let mut config = McpConfig::new("/mcp", &url).unwrap();
    config.principal = Arc::new(AccountHeader);
    config.units = oncely_mcp::parse_units("json:/text").unwrap();
    let gw = Gateway::start(config).await;

    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    let send = |account: Option<&'static str>, id: i64, arguments: Value| {
        let mut req = Request::post(&gw.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(account) = account {
            req = req.header("x-account", account);
        }
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "count", "arguments": arguments}});
        let req = req
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap();
        let client = client.clone();
        async move {
            let resp = client.request(req).await.unwrap();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            serde_json::from_slice::<Value>(&bytes).unwrap()
        }
    };
    let hello = json!({"text": "héllo"});
    assert_eq!(
        replay_status(&send(Some("a"), 1, hello.clone()).await),
        None
    );
    gw.guard.drain().await;
    let again = send(Some("a"), 2, hello.clone()).await;
    assert_eq!(replay_status(&again), Some("replayed"), "{again}");
    assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    // Another account is another scope; no account is not guarded.
    assert_eq!(
        replay_status(&send(Some("b"), 3, hello.clone()).await),
        None
    );
    assert_eq!(replay_status(&send(None, 4, hello.clone()).await), None);
    assert_eq!(replay_status(&send(None, 5, hello).await), None);
    gw.guard.drain().await;
    assert_eq!(counter.0.load(Ordering::SeqCst), 4);

    let records = gw.store.list(&Default::default()).await.unwrap();
    assert_eq!(records.len(), 2, "one record per account, none unguarded");
    assert!(records.iter().all(|r| r.units == 5), "{records:?}");
    assert_ne!(records[0].principal, records[1].principal);
}
