//! Acknowledgement benchmark of the webhook ingress: signed deliveries posted over HTTP
//! on 127.0.0.1 by concurrent senders; reports acknowledged events per second and the
//! p50/p99 acknowledgement latency, for new events and for duplicates.
//!
//! ```text
//! cargo run --release -p oncely-webhooks --example ack_bench -- [STORE_URL] [SENDERS] [EVENTS] [SYNC]
//! # STORE_URL: sqlite://PATH (default: a temporary file) or postgres://...
//! # SYNC: SQLite's synchronous mode, FULL (default) or NORMAL
//! ```
//!
//! No worker runs: this measures the ingress alone (verify, claim + queue in one
//! transaction, answer). Deliveries queue up in the store.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oncely_store::StoreOptions;
use oncely_webhooks::{sign, Scheme, Secrets, Verifier, WebhookConfig, WebhookEndpoint};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = tempfile::tempdir().unwrap();
    let url = args
        .first()
        .cloned()
        .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("bench.db").display()));
    let senders: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    let events: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4000);
    let sync = args.get(3).cloned().unwrap_or_else(|| "FULL".into());
    let options = StoreOptions {
        sqlite_synchronous: sync.clone(),
        ..StoreOptions::default()
    };
    let store = oncely_store::open(&url, options).await.unwrap();
    let scheme: Scheme = "standard".parse().unwrap();
    let secrets = Secrets::parse(&scheme, SECRET).unwrap();
    let verifier = Verifier::new(scheme.clone(), secrets.clone(), Duration::from_secs(300));
    let config = WebhookConfig::new("/hooks/bench", verifier, "http://127.0.0.1:9/unused");
    let router = WebhookEndpoint::new(config, store).router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let run = format!("{:08x}", rand::random::<u32>());
    let store_name = url.split("://").next().unwrap_or("?").to_string();
    println!("store={store_name} senders={senders} events={events} sqlite_synchronous={sync}");
    for (label, expect) in [("new", "fresh"), ("duplicate", "duplicate")] {
        let (rate, p50, p99) = round(addr, &scheme, &secrets, &run, senders, events, expect).await;
        println!(
            "{store_name:8} {label:9} {rate:8.0} acks/s   p50 {:6.2} ms   p99 {:6.2} ms",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
}

/// Posts `events` deliveries (ids `run-0..events`) from `senders` tasks; every answer must
/// carry `Oncely-Status: expect`.
async fn round(
    addr: std::net::SocketAddr,
    scheme: &Scheme,
    secrets: &Secrets,
    run: &str,
    senders: usize,
    events: usize,
    expect: &'static str,
) -> (f64, Duration, Duration) {
    let client = Arc::new(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let requests: Vec<_> = (0..events)
        .map(|i| {
            let id = format!("evt_{run}_{i}");
            let body = format!(
                "{{\"id\":\"{id}\",\"type\":\"invoice.paid\",\"data\":{{\"amount\":{i}}}}}"
            );
            let headers = sign(scheme, secrets.primary(), &id, now, body.as_bytes());
            (headers, Bytes::from(body))
        })
        .collect();
    let requests = Arc::new(requests);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut joins = Vec::new();
    for _ in 0..senders {
        let (client, requests, next) = (client.clone(), requests.clone(), next.clone());
        joins.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((headers, body)) = requests.get(i) else {
                    return latencies;
                };
                let mut req = http::Request::post(format!("http://{addr}/hooks/bench"))
                    .header("content-type", "application/json");
                for (n, v) in headers {
                    req = req.header(n, v);
                }
                let t = Instant::now();
                let res = client
                    .request(req.body(Full::new(body.clone())).unwrap())
                    .await
                    .unwrap();
                let status = res.headers().get("oncely-status").cloned();
                let _ = res.into_body().collect().await;
                latencies.push(t.elapsed());
                assert_eq!(
                    status.as_ref().and_then(|v| v.to_str().ok()),
                    Some(expect),
                    "unexpected answer"
                );
            }
        }));
    }
    let mut all = Vec::new();
    for j in joins {
        all.extend(j.await.unwrap());
    }
    let elapsed = started.elapsed();
    all.sort();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    (events as f64 / elapsed.as_secs_f64(), pct(0.50), pct(0.99))
}
