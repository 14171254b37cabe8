//! The reverse proxy, in-process (`oncely::serve::run` on port 0): hop-by-hop headers,
//! forwarding headers, streaming of large bodies, https upstreams with a test CA, and
//! HTTPS on `listen`.

use std::net::SocketAddr;

use axum::routing::{get, post};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use oncely::config::{Config, Overrides};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::common::{echo_headers, get as http_get, https_upstream, send, upstream, TestPki};

/// A gateway running in this process; stops when dropped.
pub(crate) struct InProcess {
    pub(crate) addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl InProcess {
    pub(crate) async fn start(config_text: &str, base: Option<&std::path::Path>) -> InProcess {
        let overrides = Overrides {
            store: Some("memory:".into()),
            ..Overrides::default()
        };
        let config = Config::resolve(config_text, base, &overrides).expect("a valid config");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(oncely::serve::run(listener, admin, config, async move {
            let _ = rx.await;
        }));
        InProcess {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops it and waits for the drain.
    pub(crate) async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// Sends raw bytes and reads the whole answer (the request asks to close).
async fn raw(addr: SocketAddr, request: &str) -> (String, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    (
        String::from_utf8_lossy(&out[..split]).to_lowercase(),
        out[split + 4..].to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_dropped_both_ways_and_forwarding_headers_added() {
    let up = upstream(echo_headers().route(
        "/answer",
        get(|| async {
            (
                [
                    ("connection", "x-up-private"),
                    ("x-up-private", "1"),
                    ("keep-alive", "timeout=9"),
                    ("proxy-authenticate", "Basic"),
                    ("x-up-public", "1"),
                ],
                "ok",
            )
        }),
    ))
    .await;
    let gw = InProcess::start(&format!("upstream = \"http://{up}\"\n"), None).await;

    let (head, body) = raw(
        gw.addr,
        "GET /echo?q=1 HTTP/1.1\r\nHost: gw.example\r\nConnection: close, X-Drop-Me\r\n\
         X-Drop-Me: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic eA==\r\n\
         TE: trailers\r\nUpgrade: h2c\r\nX-Keep: yes\r\nX-Forwarded-For: 10.1.2.3\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    for gone in [
        "x-drop-me",
        "keep-alive",
        "proxy-authorization",
        "te",
        "upgrade",
    ] {
        assert!(
            seen.get(gone).is_none(),
            "{gone} reached the upstream: {seen}"
        );
    }
    if let Some(c) = seen.get("connection") {
        assert!(!c.as_str().unwrap().contains("x-drop-me"), "{seen}");
    }
    assert_eq!(seen["x-keep"], "yes");
    assert_eq!(seen["_path"], "/echo?q=1");
    assert_eq!(seen["x-forwarded-for"], "10.1.2.3, 127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "gw.example");
    assert_eq!(
        seen["forwarded"],
        "for=127.0.0.1;proto=http;host=gw.example"
    );
    assert_eq!(seen["host"], up.to_string(), "Host is the upstream's");

    let (head, body) = raw(
        gw.addr,
        "GET /answer HTTP/1.1\r\nHost: gw.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(body, b"ok");
    assert!(head.contains("x-up-public: 1"), "{head}");
    for gone in ["x-up-private", "keep-alive", "proxy-authenticate"] {
        assert!(!head.contains(gone), "{gone} reached the client: {head}");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_unguarded_bodies_stream_through_both_ways() {
    const SIZE: usize = 48 << 20; // over max_body: unguarded requests are not limited
    let up = upstream(
        axum::Router::new()
            .route(
                "/upload",
                post(|body: axum::body::Body| async move {
                    let mut n = 0usize;
                    let mut stream = body.into_data_stream();
                    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
                        n += chunk.unwrap().len();
                    }
                    n.to_string()
                }),
            )
            .route(
                "/download",
                get(|| async {
                    let chunks = (0..SIZE / 65536)
                        .map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 65536])));
                    axum::body::Body::from_stream(futures::stream::iter(chunks))
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable()),
    )
    .await;
    let gw = InProcess::start(
        &format!("upstream = \"http://{up}\"\nmax_body = \"1MiB\"\n"),
        None,
    )
    .await;
    let res = send(
        Request::post(gw.url("/upload"))
            .body(Full::new(Bytes::from(vec![7u8; SIZE])))
            .unwrap(),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.text(), SIZE.to_string());
    let res = http_get(&gw.url("/download"), &[]).await;
    assert_eq!(res.status, 200);
    assert_eq!(res.body.len(), SIZE);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_against_the_configured_ca() {
    let pki = TestPki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.write(dir.path());
    let up = https_upstream(&pki, echo_headers()).await;

    // With the test CA as upstream_ca (relative to the config's directory).
    let gw = InProcess::start(
        &format!(
            "upstream = \"https://localhost:{}\"\nupstream_ca = \"ca.pem\"\n",
            up.port()
        ),
        Some(dir.path()),
    )
    .await;
    let res = http_get(&gw.url("/over-tls"), &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["_path"], "/over-tls");
    gw.stop().await;

    // Without it, the certificate is not trusted: 502, nothing forwarded.
    let gw = InProcess::start(
        &format!("upstream = \"https://localhost:{}\"\n", up.port()),
        None,
    )
    .await;
    let res = http_get(&gw.url("/over-tls"), &[]).await;
    assert_eq!(res.status, 502, "{}", res.text());
    assert_eq!(res.json()["code"], "upstream_unreachable");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_https_when_tls_is_set() {
    let pki = TestPki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.write(dir.path());
    let up = upstream(echo_headers()).await;
    let gw = InProcess::start(
        &format!(
            "upstream = \"http://{up}\"\ntls = {{ cert = \"cert.pem\", key = \"key.pem\" }}\n"
        ),
        Some(dir.path()),
    )
    .await;
    let client = pki.client();
    let res = client
        .request(
            Request::get(format!("https://localhost:{}/secure", gw.addr.port()))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .expect("a TLS answer");
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen["x-forwarded-proto"], "https");
    assert_eq!(seen["_path"], "/secure");
    // Plain HTTP on the TLS port gets no HTTP answer.
    let plain = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>()
        .request(
            Request::get(gw.url("/secure"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert!(plain.is_err());
    gw.stop().await;
}
