//! An error of the gateway's own is said as its code everywhere a request is described:
//! `Oncely-Status`, the request span's `oncely.status` and its `error.type`, and the log
//! line's `status`; so an operator tells oncely's 502 from the upstream's own. And a
//! guarded MCP call whose result has `isError` is a `tool_error` on its span, fresh or
//! replayed. Through the real binary, against a real OTLP receiver.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::post;

use crate::common::{post as http_post, upstream, Gateway};
use crate::otlp::{Got, Mode, Receiver};
use opentelemetry_proto::tonic::common::v1::any_value::Value;

const ALICE: (&str, &str) = ("authorization", "Bearer sk_alice");

/// A port nothing listens on (bound, then closed).
fn dead_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// `oncely serve` with `routes` (each a `[[routes]]` body) before `up`, exporting spans to
/// `collector`, logging JSON lines.
fn gateway(
    dir: &std::path::Path,
    up: SocketAddr,
    routes: &[&str],
    collector: &Receiver,
) -> Gateway {
    let mut config = format!(
        "store = \"sqlite://{db}\"\nupstream = \"http://{up}\"\n",
        db = dir.join("ledger.db").display()
    );
    for r in routes {
        config.push_str(&format!("[[routes]]\n{r}\n"));
    }
    config.push_str(&format!(
        "[tracing]\notlp_endpoint = \"{}\"\nschedule_delay = \"100ms\"\n",
        collector.http_url()
    ));
    let file = dir.join("oncely.toml");
    std::fs::write(&file, config).unwrap();
    Gateway::start(
        &["--config", file.to_str().unwrap(), "--log-format", "json"],
        &[],
    )
}

/// The server span of the request to `path` whose `oncely.status` is `status`.
async fn span_of(collector: &Receiver, path: &str, status: &str) -> Got {
    let pick = |g: &Got| text(g, "url.path") == path && text(g, "oncely.status") == status;
    collector.wait_for(1, pick).await.remove(0)
}

/// A span's text attribute `key` (empty when it has none).
fn text(g: &Got, key: &str) -> String {
    match g.attr(key) {
        Some(Value::StringValue(s)) => s,
        _ => String::new(),
    }
}

/// The request log lines of `route`, as JSON.
fn lines_of(gw: &Gateway, route: &str) -> Vec<serde_json::Value> {
    gw.lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["fields"]["route"] == route || l["route"] == route)
        .collect()
}

fn status_of_line(line: &serde_json::Value) -> String {
    line["fields"]["status"]
        .as_str()
        .or(line["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_slow_upstream_is_the_gateway_s_code_in_the_header_the_span_and_the_line()
{
    let collector = Receiver::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let dead = dead_port();
    // A slow upstream for the timeout, on its own port; the others go to the dead one.
    let slow = upstream(axum::Router::new().route(
        "/v1/slow",
        post(|| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            "late"
        }),
    ))
    .await;
    let gw = gateway(
        dir.path(),
        dead,
        &[
            "method = \"POST\"\npath = \"/v1/write\"\nclass = \"write\"",
            "method = \"POST\"\npath = \"/v1/read\"\nclass = \"read\"",
            "method = \"POST\"\npath = \"/v1/maybe\"\nclass = \"write\"\nguard_when = { header = \"x-guard\", prefix = \"yes\" }",
            &format!(
                "method = \"POST\"\npath = \"/v1/slow\"\nclass = \"write\"\ntimeout = \"500ms\"\nupstream = \"http://{slow}\""
            ),
        ],
        &collector,
    );
    let cases = [
        ("/v1/write", 502, "upstream_unreachable"),
        ("/v1/read", 502, "upstream_unreachable"),
        ("/v1/maybe", 502, "upstream_unreachable"),
        ("/v1/slow", 504, "upstream_timeout"),
    ];
    for (path, status, code) in cases {
        let a = http_post(&gw.url(path), "{}", &[ALICE]).await;
        assert_eq!(a.status, status, "{path}: {}", a.text());
        assert_eq!(a.header("oncely-problem"), code, "{path}");
        assert_eq!(a.header("oncely-status"), code, "{path}: Oncely-Status");
        let span = span_of(&collector, path, code).await;
        assert_eq!(span.str("error.type"), code, "{path}: error.type");
        assert!(span.attr("oncely.upstream_status").is_none(), "{path}");
        assert_eq!(span.int("http.response.status_code"), i64::from(status));
    }
    for route in ["POST /v1/write", "POST /v1/slow", "POST /v1/maybe"] {
        let lines = lines_of(&gw, route);
        assert!(!lines.is_empty(), "{route}: a line");
        let statuses: Vec<String> = lines.iter().map(status_of_line).collect();
        assert!(
            statuses.iter().all(|s| s.starts_with("upstream_")),
            "{route}: {statuses:?}"
        );
    }
    // An upstream's own 502 stays the upstream's: fresh, its status on the span.
    let bad = upstream(axum::Router::new().route(
        "/v1/write",
        post(|| async { (http::StatusCode::BAD_GATEWAY, "upstream's own") }),
    ))
    .await;
    let dir2 = tempfile::tempdir().unwrap();
    let gw2 = gateway(
        dir2.path(),
        bad,
        &["method = \"POST\"\npath = \"/v1/write\"\nclass = \"write\""],
        &collector,
    );
    let a = http_post(&gw2.url("/v1/write"), "{\"n\":2}", &[ALICE]).await;
    assert_eq!(a.status, 502);
    assert_eq!(a.header("oncely-status"), "fresh");
    assert_eq!(a.text(), "upstream's own");
    let span = span_of(&collector, "/v1/write", "fresh").await;
    assert_eq!(span.str("error.type"), "502");
    assert_eq!(span.int("oncely.upstream_status"), 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_the_gateway_s_own_is_its_code_on_the_span_too() {
    let collector = Receiver::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let up = upstream(axum::Router::new().route(
        "/v1/slow",
        post(|| async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            "done"
        }),
    ))
    .await;
    let gw = gateway(
        dir.path(),
        up,
        &["method = \"POST\"\npath = \"/v1/slow\"\nclass = \"write\"\nwait = \"100ms\""],
        &collector,
    );
    let url = gw.url("/v1/slow");
    let first = tokio::spawn({
        let url = url.clone();
        async move { http_post(&url, "{\"a\":1}", &[ALICE]).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dup = http_post(&url, "{\"a\":1}", &[ALICE]).await;
    assert_eq!(dup.status, 409, "{}", dup.text());
    assert_eq!(dup.header("oncely-status"), "in_flight");
    let span = span_of(&collector, "/v1/slow", "in_flight").await;
    assert_eq!(span.str("error.type"), "in_flight");
    let key = http_post(&url, "{}", &[ALICE, ("idempotency-key", "")]).await;
    assert_eq!(key.status, 400);
    assert_eq!(key.header("oncely-status"), "key_invalid");
    let span = span_of(&collector, "/v1/slow", "key_invalid").await;
    assert_eq!(span.str("error.type"), "key_invalid");
    assert_eq!(first.await.unwrap().header("oncely-status"), "fresh");
    let fresh = span_of(&collector, "/v1/slow", "fresh").await;
    assert!(fresh.attr("error.type").is_none(), "a 200 is no error");
}

/// An MCP server whose `tools/call` answers a result with `isError: true`, or (for the
/// tool `fine`) a plain one.
fn failing_tool_server() -> axum::Router {
    axum::Router::new().route(
        "/mcp",
        post(|body: String| async move {
            let message: serde_json::Value = serde_json::from_str(&body).unwrap();
            let failed = message["params"]["name"] != "fine";
            axum::Json(serde_json::json!({
                "jsonrpc": "2.0", "id": message["id"],
                "result": {"content": [{"type": "text", "text": "the card was declined"}],
                           "isError": failed}
            }))
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_tool_result_with_is_error_is_a_tool_error_fresh_and_replayed() {
    let collector = Receiver::start(Mode::Ok);
    let up = upstream(failing_tool_server()).await;
    let dir = tempfile::tempdir().unwrap();
    let dead = dead_port();
    let config = format!(
        "store = \"sqlite://{db}\"\n[[mcp]]\npath = \"/mcp\"\nupstream = \"http://{up}/mcp\"\n\
         [[mcp]]\npath = \"/dead\"\nupstream = \"http://{dead}/mcp\"\n\
         [tracing]\notlp_endpoint = \"{otlp}\"\nschedule_delay = \"100ms\"\n",
        db = dir.path().join("ledger.db").display(),
        otlp = collector.http_url(),
    );
    let file = dir.path().join("oncely.toml");
    std::fs::write(&file, config).unwrap();
    let gw = Gateway::start(&["--config", file.to_str().unwrap()], &[]);
    let headers = [
        ALICE,
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    let call = |id: i64, tool: &str| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {"amount": 5}}})
        .to_string()
    };
    for (id, want) in [(1, "fresh"), (2, "replayed")] {
        let a = http_post(&gw.url("/mcp"), &call(id, "pay"), &headers).await;
        assert_eq!(a.header("oncely-status"), want, "{}", a.text());
        assert_eq!(a.json()["result"]["isError"], true);
    }
    let a = http_post(&gw.url("/mcp"), &call(3, "fine"), &headers).await;
    assert_eq!(a.header("oncely-status"), "fresh");
    let is_call = |tool: &'static str| {
        move |g: &Got| g.attr("mcp.method.name").is_some() && text(g, "gen_ai.tool.name") == tool
    };
    let spans = collector.wait_for(2, is_call("pay")).await;
    for s in &spans {
        assert_eq!(
            s.str("error.type"),
            "tool_error",
            "{}: error.type",
            s.str("oncely.status")
        );
    }
    let fine = collector.wait_for(1, is_call("fine")).await.remove(0);
    assert!(fine.attr("error.type").is_none());
    assert_eq!(fine.str("oncely.status"), "fresh");

    // oncely's own failure of a guarded call: its code in the header and on the span.
    let a = http_post(&gw.url("/dead"), &call(4, "pay"), &headers).await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(a.header("oncely-status"), "upstream_unreachable");
    let pick = |g: &Got| {
        g.attr("mcp.method.name").is_some() && text(g, "oncely.status") == "upstream_unreachable"
    };
    let span = collector.wait_for(1, pick).await.remove(0);
    assert_eq!(span.str("error.type"), "upstream_unreachable");
}
