//! Pass-through overhead of the MCP endpoint: `tools/list` and a replayed `tools/call`
//! through oncely against the same calls made directly to the Python SDK server.
//!
//! Run with:
//! `cargo test -p oncely-mcp --release --test it bench -- --ignored --nocapture`

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oncely_mcp::McpConfig;
use serde_json::{json, Value};

use crate::harness::{python, Gateway, PaidServer};

type Http = Client<HttpConnector, Full<Bytes>>;

struct Session {
    http: Http,
    url: String,
    session: Option<String>,
}

impl Session {
    async fn open(http: Http, url: &str) -> Session {
        let mut s = Session {
            http,
            url: url.to_string(),
            session: None,
        };
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}});
        s.post(&init).await;
        s.post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        s
    }

    async fn post(&mut self, body: &Value) -> Value {
        let mut req = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", "Bearer bench")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(sid) = &self.session {
            req = req.header("mcp-session-id", sid);
        }
        let resp = self
            .http
            .request(req.body(Full::new(Bytes::from(body.to_string()))).unwrap())
            .await
            .unwrap();
        if let Some(sid) = resp.headers().get("mcp-session-id") {
            self.session = Some(sid.to_str().unwrap().to_string());
        }
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        let data = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .next_back()
            .map(str::trim)
            .unwrap_or(&text);
        serde_json::from_str(data).unwrap_or(Value::Null)
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn measure(s: &mut Session, body: &Value, n: usize) -> (f64, f64) {
    for _ in 0..20 {
        s.post(body).await;
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let v = s.post(body).await;
        times.push(t.elapsed());
        assert!(v.get("result").is_some(), "{v}");
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn bench_pass_through_and_replay() {
    let Some(py) = python() else { return };
    let server = PaidServer::start(&py, 0.0);
    let gw = Gateway::start(McpConfig::new("/mcp", &server.url).unwrap()).await;
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    let n = 500;
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list"});
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"render","arguments":{"text":"bench"}}});

    let mut direct = Session::open(http.clone(), &server.url).await;
    let mut via = Session::open(http.clone(), &gw.url).await;
    let d_list = measure(&mut direct, &list, n).await;
    let g_list = measure(&mut via, &list, n).await;
    let d_call = measure(&mut direct, &call, n).await;
    let g_call = measure(&mut via, &call, n).await;
    println!("| request | direct p50 / p99 (us) | through oncely p50 / p99 (us) |");
    println!("| --- | --- | --- |");
    println!(
        "| tools/list (pass-through) | {:.0} / {:.0} | {:.0} / {:.0} |",
        d_list.0, d_list.1, g_list.0, g_list.1
    );
    println!("| tools/call render (direct: executes; oncely: replayed) | {:.0} / {:.0} | {:.0} / {:.0} |", d_call.0, d_call.1, g_call.0, g_call.1);
}
