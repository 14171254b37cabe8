//! Traces through the real binary, against a real OTLP receiver (`tests/otlp/receiver.py`,
//! its OTLP/HTTP protobuf side):
//! a span per guarded request with its decision, record, route, attempt and upstream
//! status; the upstream's `traceparent` continues the caller's trace; no `[tracing]`
//! section sends nothing; a dead or hanging collector costs requests nothing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use http::HeaderMap;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

use crate::common::{get, post as http_post, upstream, Answer, Gateway};
use crate::otlp::{Got, Mode, Receiver};

const ALICE: (&str, &str) = ("authorization", "Bearer sk_alice");
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The receiver of the test: a real OTLP receiver ([`crate::otlp`]), its HTTP side.
struct Collector(Receiver);

impl Collector {
    fn new() -> Collector {
        Collector(Receiver::start(Mode::Ok))
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.0.http))
    }

    fn spans(&self) -> Vec<Got> {
        self.0.spans()
    }

    /// How many export requests came.
    fn requests(&self) -> usize {
        self.0.exports().len()
    }

    /// The headers of the last export request.
    fn last_headers(&self) -> serde_json::Map<String, serde_json::Value> {
        let exports = self.0.exports();
        let last = exports.last().expect("an export");
        assert_eq!(last.content_type, "application/x-protobuf");
        last.headers.clone()
    }

    async fn wait_for(&self, n: usize, pick: impl Fn(&Got) -> bool) -> Vec<Got> {
        self.0.wait_for(n, pick).await
    }
}

/// What the render upstream saw: each call's `traceparent` and `tracestate`.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<HashMap<String, String>>>>);

impl Seen {
    fn calls(&self) -> Vec<HashMap<String, String>> {
        self.0.lock().unwrap().clone()
    }
}

/// Records the call's trace headers and body; answers 201 (after 800 ms for a body that
/// says "slow").
async fn record(
    State(seen): State<Seen>,
    headers: HeaderMap,
    body: String,
) -> (http::StatusCode, [(&'static str, &'static str); 1], String) {
    let mut h = HashMap::new();
    for name in ["traceparent", "tracestate"] {
        if let Some(v) = headers.get(name) {
            h.insert(name.to_string(), v.to_str().unwrap().to_string());
        }
    }
    h.insert("body".into(), body.clone());
    seen.0.lock().unwrap().push(h);
    if body.contains("slow") {
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    (
        http::StatusCode::CREATED,
        [("content-type", "application/json")],
        format!("{{\"rendered\":{body:?}}}"),
    )
}

/// `POST /v1/render` (a `write` route) and `POST /v1/job` (a `job` route).
fn render_service(seen: Seen) -> axum::Router {
    axum::Router::new()
        .route("/v1/render", post(record))
        .route("/v1/job", post(record))
        .with_state(seen)
}

fn config(dir: &std::path::Path, up: SocketAddr, tracing: &str) -> String {
    let cfg = dir.join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = "sqlite://{db}"
upstream = "http://{up}"
[[routes]]
method = "POST"
path = "/v1/render"
class = "write"
[[routes]]
method = "POST"
path = "/v1/job"
class = "job"
wait = "10s"
{tracing}
"#,
            db = dir.join("ledger.db").display(),
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_owned()
}

fn tracing_section(collector: SocketAddr, extra: &str) -> String {
    format!(
        "[tracing]\notlp_endpoint = \"http://{collector}\"\nservice_name = \"edge-test\"\nschedule_delay = \"100ms\"\n{extra}\n"
    )
}

async fn render(gw: &Gateway, body: &str, extra: &[(&str, &str)]) -> Answer {
    let mut headers = vec![ALICE];
    headers.extend_from_slice(extra);
    http_post(&gw.url("/v1/render"), body, &headers).await
}

/// An MCP message's server span (not the HTTP request's that carries it).
fn is_mcp(g: &Got) -> bool {
    g.span.kind == SpanKind::Server as i32 && g.attr("mcp.method.name").is_some()
}

/// The HTTP server span `span` runs under: `POST /mcp` with the HTTP conventions, a child
/// of the caller's span.
async fn assert_under_http_span(collector: &Collector, span: &Got) {
    let parent = span.span.parent_span_id.clone();
    let http = collector
        .wait_for(1, |g| g.span.span_id == parent)
        .await
        .remove(0);
    assert_eq!(http.span.kind, SpanKind::Server as i32);
    assert_eq!(http.span.name, "POST /mcp");
    assert_eq!(http.str("http.route"), "/mcp");
    assert_eq!(http.str("http.request.method"), "POST");
    assert!(http.attr("http.response.status_code").is_some());
    assert!(http.attr("mcp.method.name").is_none());
    assert_eq!(hex(&http.span.parent_span_id), CALLER_SPAN);
    assert_eq!(http.span.trace_id, span.span.trace_id);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Trace id and parent id of a valid `traceparent`.
fn parse(tp: &str) -> (String, String, String) {
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!(parts[0], "00", "{tp}");
    assert_eq!(parts[1].len(), 32, "{tp}");
    assert_eq!(parts[2].len(), 16, "{tp}");
    (
        parts[1].to_string(),
        parts[2].to_string(),
        parts[3].to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_request_and_its_replay_are_two_spans_and_the_upstream_continues_the_callers_trace()
{
    let collector = Collector::new();
    let otlp = collector.addr();
    let seen = Seen::default();
    let up = upstream(render_service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let extra = "headers = { \"x-team\" = \"edge\" }\nheaders_env = \"TEST_OTLP_HEADERS\"";
    let gw = Gateway::start(
        &[
            "--config",
            &config(dir.path(), up, &tracing_section(otlp, extra)),
        ],
        &[("TEST_OTLP_HEADERS", "x-api-key=secret-1, x-tenant = t7")],
    );
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let with_trace = [
        ("traceparent", caller.as_str()),
        ("tracestate", "vendor=abc"),
        ("user-agent", "agent-test/1.0"),
    ];

    let fresh = render(&gw, r#"{"text":"one"}"#, &with_trace).await;
    assert_eq!(fresh.status, 201, "{}", fresh.text());
    assert_eq!(fresh.header("oncely-status"), "fresh");
    let record = fresh.header("oncely-record").to_owned();
    let replay = render(&gw, r#"{"text":"one"}"#, &with_trace).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("oncely-status"), "replayed");
    assert_eq!(replay.header("oncely-record"), record);

    // One execution; the upstream got the caller's trace with a span of oncely's own.
    let calls = seen.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (trace, parent, flags) = parse(&calls[0]["traceparent"]);
    assert_eq!(trace, CALLER_TRACE);
    assert_ne!(parent, CALLER_SPAN);
    assert_eq!(flags, "01");
    assert_eq!(calls[0]["tracestate"], "vendor=abc");

    let servers = collector
        .wait_for(2, |g| g.span.kind == SpanKind::Server as i32)
        .await;
    let by_decision = |d: &str| {
        servers
            .iter()
            .find(|g| g.str("oncely.status") == d)
            .unwrap_or_else(|| panic!("no {d} span in {servers:#?}"))
            .clone()
    };
    let first = by_decision("fresh");
    let second = by_decision("replayed");
    for s in [&first, &second] {
        assert_eq!(s.service(), "edge-test");
        assert_eq!(hex(&s.span.trace_id), CALLER_TRACE);
        assert_eq!(hex(&s.span.parent_span_id), CALLER_SPAN);
        assert_eq!(s.str("oncely.record"), record);
        assert_eq!(s.str("http.route"), "/v1/render");
        assert_eq!(s.int("oncely.attempt"), 1);
        assert_eq!(s.int("http.response.status_code"), 201);
        assert_eq!(s.str("oncely.principal").len(), 64, "the keyed hash");
        assert_eq!(s.span.trace_state, "vendor=abc");
    }
    assert_ne!(first.span.span_id, second.span.span_id);
    let sent = collector.last_headers();
    assert_eq!(sent["x-team"], "edge");
    assert_eq!(sent["x-api-key"], "secret-1");
    assert_eq!(sent["x-tenant"], "t7");
    assert_eq!(first.int("oncely.upstream_status"), 201);
    assert_eq!(first.span.name, "POST /v1/render");
    // The stable HTTP server conventions, and oncely's own.
    for s in [&first, &second] {
        assert_eq!(s.str("http.request.method"), "POST");
        assert_eq!(s.str("url.path"), "/v1/render");
        assert_eq!(s.str("url.scheme"), "http");
        assert_eq!(s.str("server.address"), "127.0.0.1");
        assert_eq!(s.int("server.port"), i64::from(gw.addr.port()));
        assert_eq!(s.str("client.address"), "127.0.0.1");
        assert_eq!(s.str("user_agent.original"), "agent-test/1.0");
        assert_eq!(s.str("network.protocol.version"), "1.1");
        assert_eq!(s.str("oncely.class"), "write");
        assert_eq!(s.str("oncely.key_source"), "fingerprint");
        assert!(s.attr("error.type").is_none());
    }
    assert_eq!(second.str("oncely.status"), "replayed");
    // The replay links to the span that executed the original.
    assert_eq!(second.span.links.len(), 1);
    assert_eq!(second.span.links[0].trace_id, first.span.trace_id);
    assert_eq!(second.span.links[0].span_id, first.span.span_id);
    assert!(first.span.links.is_empty());

    // The upstream call is a client span under the fresh request's, and it is the
    // parent the upstream was told.
    let clients = collector
        .wait_for(1, |g| g.span.kind == SpanKind::Client as i32)
        .await;
    assert_eq!(clients.len(), 1, "only the fresh request called upstream");
    let client = &clients[0];
    assert_eq!(hex(&client.span.trace_id), CALLER_TRACE);
    assert_eq!(client.span.parent_span_id, first.span.span_id);
    assert_eq!(hex(&client.span.span_id), parent);
    assert_eq!(client.int("http.response.status_code"), 201);
    assert_eq!(client.span.name, "POST");
    assert_eq!(client.str("http.request.method"), "POST");
    assert_eq!(client.str("url.full"), format!("http://{up}/v1/render"));
    assert_eq!(client.str("server.address"), "127.0.0.1");
    assert_eq!(client.int("server.port"), i64::from(up.port()));
    assert!(client.span.end_time_unix_nano >= client.span.start_time_unix_nano);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_are_one_fresh_span_with_an_upstream_call_and_joined_spans() {
    let collector = Collector::new();
    let otlp = collector.addr();
    let seen = Seen::default();
    let up = upstream(render_service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Arc::new(Gateway::start(
        &[
            "--config",
            &config(dir.path(), up, &tracing_section(otlp, "")),
        ],
        &[],
    ));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let gw = gw.clone();
            tokio::spawn(async move { render(&gw, r#"{"text":"slow one"}"#, &[]).await })
        })
        .collect();
    let mut statuses = Vec::new();
    let mut records = Vec::new();
    for c in callers {
        let a = c.await.unwrap();
        assert_eq!(a.status, 201, "{}", a.text());
        statuses.push(a.header("oncely-status").to_owned());
        records.push(a.header("oncely-record").to_owned());
    }
    assert_eq!(seen.calls().len(), 1, "executed once");
    assert_eq!(statuses.iter().filter(|s| *s == "fresh").count(), 1);
    let servers = collector
        .wait_for(8, |g| g.span.kind == SpanKind::Server as i32)
        .await;
    let mut decisions: Vec<String> = servers.iter().map(|s| s.str("oncely.status")).collect();
    let mut want = statuses.clone();
    decisions.sort();
    want.sort();
    assert_eq!(
        decisions, want,
        "one span per request, with its Oncely-Status"
    );
    assert!(decisions.iter().any(|d| d == "joined"), "{decisions:?}");
    for s in &servers {
        assert_eq!(s.str("oncely.record"), records[0]);
        assert!(
            s.span.parent_span_id.is_empty(),
            "no caller trace: a root span"
        );
    }
    // One upstream call, one client span, under the fresh request's span.
    let fresh = servers
        .iter()
        .find(|s| s.str("oncely.status") == "fresh")
        .unwrap();
    let clients = collector
        .wait_for(1, |g| g.span.kind == SpanKind::Client as i32)
        .await;
    assert_eq!(clients.len(), 1);
    assert_eq!(clients[0].span.parent_span_id, fresh.span.span_id);
    assert_eq!(clients[0].span.trace_id, fresh.span.trace_id);
    // Every joined (or replayed) span links to the fresh one.
    for s in servers.iter().filter(|s| s.str("oncely.status") != "fresh") {
        assert_eq!(s.span.links.len(), 1, "{:?}", s.span);
        assert_eq!(s.span.links[0].span_id, fresh.span.span_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_or_missing_traceparent_starts_a_new_trace_and_is_never_passed_on() {
    let collector = Collector::new();
    let otlp = collector.addr();
    let seen = Seen::default();
    let up = upstream(render_service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &[
            "--config",
            &config(dir.path(), up, &tracing_section(otlp, "")),
        ],
        &[],
    );
    let malformed = format!("00-{}-{CALLER_SPAN}-01", CALLER_TRACE.to_uppercase());
    let bad = render(
        &gw,
        r#"{"text":"bad"}"#,
        &[
            ("traceparent", malformed.as_str()),
            ("tracestate", "vendor=abc"),
        ],
    )
    .await;
    assert_eq!(bad.header("oncely-status"), "fresh");
    let none = render(&gw, r#"{"text":"none"}"#, &[]).await;
    assert_eq!(none.header("oncely-status"), "fresh");

    let calls = seen.calls();
    assert_eq!(calls.len(), 2);
    let mut traces = Vec::new();
    for call in &calls {
        let tp = &call["traceparent"];
        assert_ne!(tp, &malformed);
        let (trace, _, _) = parse(tp);
        assert_ne!(trace, CALLER_TRACE.to_string());
        assert!(!call.contains_key("tracestate"), "{call:?}");
        traces.push(trace);
    }
    assert_ne!(traces[0], traces[1], "two new traces");

    let servers = collector
        .wait_for(2, |g| g.span.kind == SpanKind::Server as i32)
        .await;
    for s in &servers {
        assert!(s.span.parent_span_id.is_empty(), "a root span");
        assert!(traces.contains(&hex(&s.span.trace_id)));
        assert_eq!(s.str("oncely.status"), "fresh");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submission_is_a_span_and_its_run_continues_the_trace() {
    let collector = Collector::new();
    let otlp = collector.addr();
    let seen = Seen::default();
    let up = upstream(render_service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &[
            "--config",
            &config(dir.path(), up, &tracing_section(otlp, "")),
        ],
        &[],
    );
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let job = http_post(
        &gw.url("/v1/job"),
        r#"{"text":"job"}"#,
        &[ALICE, ("traceparent", caller.as_str())],
    )
    .await;
    assert_eq!(job.status, 201, "{}", job.text());
    assert_eq!(job.header("oncely-status"), "fresh");
    let record = job.header("oncely-record").to_owned();

    let calls = seen.calls();
    assert_eq!(calls.len(), 1);
    let (trace, parent, _) = parse(&calls[0]["traceparent"]);
    assert_eq!(trace, CALLER_TRACE);

    let server = collector
        .wait_for(1, |g| g.span.kind == SpanKind::Server as i32)
        .await
        .remove(0);
    assert_eq!(server.str("http.route"), "/v1/job");
    assert_eq!(server.str("oncely.status"), "fresh");
    assert_eq!(server.str("oncely.record"), record);
    assert_eq!(hex(&server.span.parent_span_id), CALLER_SPAN);
    // The worker's upstream call: under the submission's span, the parent the upstream
    // was told.
    let run = collector
        .wait_for(1, |g| g.span.kind == SpanKind::Client as i32)
        .await
        .remove(0);
    assert_eq!(hex(&run.span.trace_id), CALLER_TRACE);
    assert_eq!(run.span.parent_span_id, server.span.span_id);
    assert_eq!(hex(&run.span.span_id), parent);
    assert_eq!(run.str("oncely.record"), record);
    assert_eq!(run.int("http.response.status_code"), 201);

    // The same job again is answered from its record, and its span links to the run
    // that executed it.
    let again = http_post(&gw.url("/v1/job"), r#"{"text":"job"}"#, &[ALICE]).await;
    assert_eq!(
        again.header("oncely-status"),
        "replayed",
        "{}",
        again.text()
    );
    assert_eq!(again.header("oncely-record"), record);
    assert_eq!(seen.calls().len(), 1, "the job ran once");
    let replay = collector
        .wait_for(1, |g| {
            g.span.kind == SpanKind::Server as i32 && g.str("oncely.status") == "replayed"
        })
        .await
        .remove(0);
    assert_eq!(replay.span.links.len(), 1, "{:?}", replay.span.links);
    assert_eq!(replay.span.links[0].span_id, run.span.span_id);
    assert_eq!(replay.span.links[0].trace_id, run.span.trace_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tracing_section_nothing_is_sent_and_traceparent_passes_as_it_came() {
    let collector = Collector::new();
    let _otlp = collector.addr();
    let seen = Seen::default();
    let up = upstream(render_service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&["--config", &config(dir.path(), up, "")], &[]);
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let malformed = "00-not-a-trace";
    for (body, tp) in [
        (r#"{"text":"a"}"#, caller.as_str()),
        (r#"{"text":"b"}"#, malformed),
    ] {
        let a = render(
            &gw,
            body,
            &[("traceparent", tp), ("tracestate", "vendor=abc")],
        )
        .await;
        assert_eq!(a.header("oncely-status"), "fresh");
    }
    let calls = seen.calls();
    assert_eq!(calls[0]["traceparent"], caller);
    assert_eq!(calls[1]["traceparent"], malformed);
    assert_eq!(calls[0]["tracestate"], "vendor=abc");
    let metrics = get(&gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        !metrics.contains("oncely_trace_spans"),
        "no exporter without [tracing]"
    );
    // Nothing is ever sent: the gateway has no exporter to send with. (A pause, not a
    // timing claim: long enough for several export rounds had there been any.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(collector.requests(), 0);
}

/// A TCP listener that accepts connections and never answers.
async fn hanging_collector() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    addr
}

/// The value of `name{labels}` in Prometheus text, 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_hanging_collector_costs_requests_nothing() {
    let seen = Seen::default();
    let up = upstream(render_service(seen.clone())).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let hanging = hanging_collector().await;
    for (name, collector) in [("dead", dead), ("hanging", hanging)] {
        let dir = tempfile::tempdir().unwrap();
        let extra =
            "max_queue = 4\nmax_batch = 2\nschedule_delay = \"20ms\"\nexport_timeout = \"60s\"";
        let section = tracing_section(collector, extra).replace("schedule_delay = \"100ms\"\n", "");
        let gw = Gateway::start(&["--config", &config(dir.path(), up, &section)], &[]);
        let gw = Arc::new(gw);
        let mut tasks = Vec::new();
        for i in 0..40 {
            let gw = gw.clone();
            tasks.push(tokio::spawn(async move {
                let body = format!("{{\"text\":\"{name}-{i}\"}}");
                render(&gw, &body, &[]).await
            }));
        }
        // Every request is answered, executed once, normally. (The timeout only turns a
        // hang into a failure.)
        for t in tasks {
            let a = tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .unwrap_or_else(|_| panic!("a request hung with a {name} collector"))
                .unwrap();
            assert_eq!(a.status, 201, "{}", a.text());
            assert_eq!(a.header("oncely-status"), "fresh");
        }
        // And the spans that could not go are counted as dropped.
        let start = Instant::now();
        loop {
            let text = get(&gw.admin_url("/metrics"), &[]).await.text();
            let full = metric(
                &text,
                "oncely_trace_spans_dropped_total{reason=\"queue_full\"}",
            );
            let failed = metric(
                &text,
                "oncely_trace_spans_dropped_total{reason=\"export_failed\"}",
            );
            let done = match name {
                // Refused at once: each batch fails and is counted.
                "dead" => failed > 0.0,
                // The first export never ends: the queue fills and the rest is dropped.
                _ => full > 0.0,
            };
            if done {
                assert_eq!(metric(&text, "oncely_trace_spans_exported_total"), 0.0);
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{name}: no dropped spans counted:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(seen.calls().len(), 80);
}

/// A JSON-only MCP server: `tools/call` answers a text result, and its `traceparent`
/// is noted.
fn mcp_server(seen: Seen) -> axum::Router {
    axum::Router::new()
        .route(
            "/mcp",
            post(
                |State(seen): State<Seen>, headers: HeaderMap, body: String| async move {
                    let message: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let mut h = HashMap::new();
                    if let Some(v) = headers.get("traceparent") {
                        h.insert("traceparent".into(), v.to_str().unwrap().to_string());
                    }
                    h.insert("body".into(), body.clone());
                    seen.0.lock().unwrap().push(h);
                    let result = serde_json::json!({"content": [{"type": "text", "text": "done"}]});
                    axum::Json(serde_json::json!({
                        "jsonrpc": "2.0", "id": message["id"], "result": result
                    }))
                },
            ),
        )
        .with_state(seen)
}

/// A gateway with one MCP endpoint (the server of [`mcp_server`]) on SQLite, exporting
/// its spans to a fresh collector.
async fn mcp_gateway() -> (Collector, Seen, Gateway, tempfile::TempDir) {
    let seen = Seen::default();
    let (collector, gw, dir) = mcp_gateway_of(mcp_server(seen.clone()), "").await;
    (collector, seen, gw, dir)
}

/// A gateway with one MCP endpoint at `/mcp` in front of `server`, the endpoint's table
/// ending with `extra`, exporting its spans to a fresh collector.
async fn mcp_gateway_of(
    server: axum::Router,
    extra: &str,
) -> (Collector, Gateway, tempfile::TempDir) {
    let collector = Collector::new();
    let up = upstream(server).await;
    let config = format!("[[mcp]]\npath = \"/mcp\"\nupstream = \"http://{up}/mcp\"\n{extra}");
    let (gw, dir) = gateway_of(&config, &collector);
    (collector, gw, dir)
}

/// `oncely serve` of a config file holding `config`, on a fresh SQLite ledger, exporting
/// its spans to `collector`.
fn gateway_of(config: &str, collector: &Collector) -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            "store = \"sqlite://{db}\"\n{config}\n{tracing}",
            db = dir.path().join("ledger.db").display(),
            tracing = tracing_section(collector.addr(), ""),
        ),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", cfg.to_str().unwrap()], &[]);
    (gw, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_tools_call_and_its_replay_are_spans_and_the_server_continues_the_trace() {
    let (collector, seen, gw, _dir) = mcp_gateway().await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let headers = [
        ALICE,
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("traceparent", caller.as_str()),
    ];
    let mut records = Vec::new();
    for (id, want) in [(1, "fresh"), (2, "replayed")] {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "render", "arguments": {"text": "hi"}}});
        let a = http_post(&gw.url("/mcp"), &body.to_string(), &headers).await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(a.header("oncely-status"), want, "{}", a.text());
        records.push(a.header("oncely-record").to_owned());
    }
    assert_eq!(records[0], records[1]);
    let calls = seen.calls();
    assert_eq!(calls.len(), 1, "the tool ran once");
    let (trace, parent, _) = parse(&calls[0]["traceparent"]);
    assert_eq!(trace, CALLER_TRACE);

    let servers = collector.wait_for(2, is_mcp).await;
    let decisions: Vec<String> = servers.iter().map(|s| s.str("oncely.status")).collect();
    assert!(decisions.contains(&"fresh".to_string()), "{decisions:?}");
    assert!(decisions.contains(&"replayed".to_string()), "{decisions:?}");
    for s in &servers {
        assert_eq!(s.str("gen_ai.tool.name"), "render");
        assert_eq!(s.str("oncely.record"), records[0]);
        assert_under_http_span(&collector, s).await;
        assert_eq!(s.int("oncely.attempt"), 1);
    }
    let fresh = servers
        .iter()
        .find(|s| s.str("oncely.status") == "fresh")
        .unwrap();
    assert_eq!(fresh.int("oncely.upstream_status"), 200);
    let replayed = servers
        .iter()
        .find(|s| s.str("oncely.status") == "replayed")
        .unwrap();
    assert_eq!(replayed.span.links.len(), 1);
    assert_eq!(replayed.span.links[0].span_id, fresh.span.span_id);
    let client = collector
        .wait_for(1, |g| g.span.kind == SpanKind::Client as i32)
        .await
        .remove(0);
    assert_eq!(client.span.parent_span_id, fresh.span.span_id);
    assert_eq!(hex(&client.span.span_id), parent);
}

#[test]
fn a_bad_tracing_section_is_a_clear_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "upstream = \"http://127.0.0.1:3000\"\n[tracing]\notlp_endpoint = \"127.0.0.1:4318\"\nsample_ratio = 2\n",
    )
    .unwrap();
    let o = crate::common::run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = crate::common::stderr(&o);
    for want in [
        "tracing.otlp_endpoint: \"127.0.0.1:4318\" must start with http:// or https://",
        "tracing.sample_ratio: must be a number from 0 to 1",
    ] {
        assert!(
            err.lines().any(|l| l.starts_with(want)),
            "{want:?} not in {err}"
        );
    }
    // `serve` refuses it with a one-line reason, before listening.
    let o = crate::common::run(&["serve", "--config", file.to_str().unwrap()]);
    crate::common::assert_usage_error(&o, "tracing.otlp_endpoint");

    // A headers_env that is not set refuses to start, naming the variable.
    std::fs::write(
        &file,
        format!(
            "store = \"sqlite://{}\"\nupstream = \"http://127.0.0.1:3000\"\n[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\nheaders_env = \"TEST_OTLP_UNSET\"\n",
            dir.path().join("ledger.db").display()
        ),
    )
    .unwrap();
    let o = crate::common::oncely()
        .args(["serve", "--config", file.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .env_remove("TEST_OTLP_UNSET")
        .output()
        .unwrap();
    crate::common::assert_usage_error(&o, "tracing.headers_env: $TEST_OTLP_UNSET is not set");
}

/// A `tracestate` as the W3C list allows it: at most 32 members `key=value`, each key
/// lower-case letters, digits and `_-*/` (one `@` for a tenant), each value 1 to 256
/// printable characters but `,` and `=`.
fn valid_tracestate(ts: &str) -> bool {
    let members: Vec<&str> = ts
        .split(',')
        .map(|m| m.trim_matches([' ', '\t']))
        .filter(|m| !m.is_empty())
        .collect();
    members.len() <= 32
        && members.iter().all(|m| {
            let Some((k, v)) = m.split_once('=') else {
                return false;
            };
            !k.is_empty()
                && k.len() <= 256
                && k.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/@".contains(&b))
                && !v.is_empty()
                && v.len() <= 256
                && v.bytes()
                    .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
        })
}

/// Hostile `traceparent` and `tracestate` values: none breaks the request, none reaches
/// the upstream invalid, a `tracestate` is cut to what the W3C asks to propagate (512
/// characters, 32 members) in the upstream call and in the exported spans alike, several
/// `tracestate` headers are one list, and a request with an ordinary trace still gets its
/// spans exported afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_trace_headers_never_reach_the_upstream_invalid_nor_swell_the_spans() {
    let collector = Collector::new();
    let otlp = collector.addr();
    let seen = Seen::default();
    let up = upstream(render_service(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &[
            "--config",
            &config(dir.path(), up, &tracing_section(otlp, "")),
        ],
        &[],
    );
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let many: String = (0..40)
        .map(|i| format!("k{i}={}", "v".repeat(200)))
        .collect::<Vec<_>>()
        .join(",");
    let huge_future = format!("01-{CALLER_TRACE}-{CALLER_SPAN}-01-{}", "x".repeat(9000));
    let zero_trace = format!("00-{}-{CALLER_SPAN}-01", "0".repeat(32));
    let zero_span = format!("00-{CALLER_TRACE}-{}-01", "0".repeat(16));
    let version_ff = format!("ff-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let with_tab = format!("00-{CALLER_TRACE}-{CALLER_SPAN}\t-01");
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "many",
            vec![("traceparent", &caller), ("tracestate", &many)],
        ),
        (
            "bad member",
            vec![
                ("traceparent", &caller),
                ("tracestate", "vendor=abc,Bad Key=<script>"),
            ],
        ),
        (
            "two headers",
            vec![
                ("traceparent", &caller),
                ("tracestate", "a=1"),
                ("tracestate", "b=2"),
            ],
        ),
        ("huge future", vec![("traceparent", &huge_future)]),
        ("zero trace", vec![("traceparent", &zero_trace)]),
        ("zero span", vec![("traceparent", &zero_span)]),
        ("version ff", vec![("traceparent", &version_ff)]),
        ("tab", vec![("traceparent", &with_tab)]),
    ];
    for (i, (name, headers)) in cases.iter().enumerate() {
        let res = render(&gw, &format!("{{\"case\":{i}}}"), headers).await;
        assert_eq!(res.status, 201, "{name}: {}", res.text());
        assert_eq!(res.header("oncely-status"), "fresh", "{name}");
    }
    let calls = seen.calls();
    assert_eq!(calls.len(), cases.len(), "{calls:?}");
    for (i, (name, _)) in cases.iter().enumerate() {
        let call = calls
            .iter()
            .find(|c| c["body"] == format!("{{\"case\":{i}}}"))
            .unwrap();
        let (trace, _, _) = parse(&call["traceparent"]);
        assert_ne!(trace, "0".repeat(32), "{name}");
        if let Some(ts) = call.get("tracestate") {
            assert!(
                ts.len() <= 512 && valid_tracestate(ts),
                "{name}: the upstream got tracestate {ts:?}"
            );
        }
        match *name {
            "many" | "two headers" | "huge future" => assert_eq!(trace, CALLER_TRACE, "{name}"),
            "bad member" => {}
            _ => assert_ne!(trace, CALLER_TRACE, "{name}: a new trace"),
        }
    }
    let by_case = |i: usize| {
        calls
            .iter()
            .find(|c| c["body"] == format!("{{\"case\":{i}}}"))
            .unwrap()
            .clone()
    };
    assert_eq!(by_case(2)["tracestate"], "a=1,b=2");
    assert!(
        by_case(0)["tracestate"].starts_with("k0="),
        "the first members are kept"
    );

    // Then an ordinary request: its spans are exported, and no span carries more than
    // what the W3C asks to propagate.
    let normal = render(
        &gw,
        r#"{"case":"normal"}"#,
        &[("traceparent", &caller), ("tracestate", "vendor=abc")],
    )
    .await;
    assert_eq!(normal.status, 201);
    let record = normal.header("oncely-record").to_owned();
    collector
        .wait_for(1, |g| {
            g.span.kind == SpanKind::Server as i32
                && g.attr("oncely.record").is_some()
                && g.str("oncely.record") == record
        })
        .await;
    for g in collector.spans().iter() {
        assert!(
            g.span.trace_state.len() <= 512 && valid_tracestate(&g.span.trace_state),
            "{}: exported tracestate {:?}",
            g.span.name,
            g.span.trace_state
        );
    }
}

/// A tools/call naming a tool of hundreds of kilobytes: the call is answered, and no
/// exported span carries more than a bounded name or attribute (a span that size would
/// make the collector refuse the whole batch, other requests' spans with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_mcp_tool_name_does_not_swell_the_exported_spans() {
    let (collector, _seen, gw, _dir) = mcp_gateway().await;
    let headers = [
        ALICE,
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    let huge = "t".repeat(300_000);
    for (id, tool) in [(1, huge.as_str()), (2, "render")] {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {"text": "hi"}}});
        let a = http_post(&gw.url("/mcp"), &body.to_string(), &headers).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let spans = collector.wait_for(2, is_mcp).await;
    assert!(spans.iter().any(|g| g.str("gen_ai.tool.name") == "render"));
    for g in collector.spans().iter() {
        let longest = g
            .span
            .attributes
            .iter()
            .filter_map(
                |kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => Some(s.len()),
                    _ => None,
                },
            )
            .max()
            .unwrap_or(0);
        assert!(
            g.span.name.len() <= 1100 && longest <= 1100,
            "a span of name {} bytes, an attribute of {longest} bytes",
            g.span.name.len()
        );
    }
}

/// The trace a tools/call carries in `params._meta` (another than its header's).
const META_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const META_SPAN: &str = "b7ad6b7169203331";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_s_meta_traceparent_is_continued_and_the_server_gets_the_client_span_in_meta_and_header(
) {
    let (collector, seen, gw, _dir) = mcp_gateway().await;
    let header_tp = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let meta_tp = format!("00-{META_TRACE}-{META_SPAN}-01");
    let headers = [
        ALICE,
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("traceparent", header_tp.as_str()),
        ("mcp-protocol-version", "2025-06-18"),
        ("mcp-session-id", "session-7"),
    ];
    let body = serde_json::json!({"jsonrpc": "2.0", "id": "call-1", "method": "tools/call",
        "params": {"name": "render", "arguments": {"text": "meta"},
            "_meta": {"traceparent": meta_tp, "tracestate": "mcpvendor=x"}}});
    let a = http_post(&gw.url("/mcp"), &body.to_string(), &headers).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let server = collector.wait_for(1, is_mcp).await.remove(0);
    // _meta's trace, ahead of the header's.
    assert_eq!(hex(&server.span.trace_id), META_TRACE);
    assert_eq!(hex(&server.span.parent_span_id), META_SPAN);
    assert_eq!(server.span.trace_state, "mcpvendor=x");
    assert_eq!(server.span.name, "tools/call render");
    assert_eq!(server.str("mcp.method.name"), "tools/call");
    assert_eq!(server.str("gen_ai.tool.name"), "render");
    assert_eq!(server.str("gen_ai.operation.name"), "execute_tool");
    assert_eq!(server.str("jsonrpc.request.id"), "call-1");
    assert_eq!(server.str("mcp.protocol.version"), "2025-06-18");
    assert_eq!(server.str("mcp.session.id"), "session-7");
    assert_eq!(server.str("network.transport"), "tcp");
    assert_eq!(server.str("oncely.status"), "fresh");
    assert_eq!(server.str("oncely.class"), "write");
    assert_eq!(server.str("oncely.key_source"), "fingerprint");
    assert_eq!(server.str("oncely.principal").len(), 64);
    assert!(server.attr("error.type").is_none());
    // The server got the client span in the header and in params._meta, the same.
    let calls = seen.calls();
    let forwarded: serde_json::Value = serde_json::from_str(&calls[0]["body"]).unwrap();
    let in_meta = forwarded["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap();
    assert_eq!(in_meta, calls[0]["traceparent"]);
    assert_eq!(forwarded["params"]["_meta"]["tracestate"], "mcpvendor=x");
    let (trace, parent, _) = parse(in_meta);
    assert_eq!(trace, META_TRACE);
    let client = collector
        .wait_for(1, |g| g.span.kind == SpanKind::Client as i32)
        .await
        .remove(0);
    assert_eq!(hex(&client.span.span_id), parent);
    assert_eq!(client.span.parent_span_id, server.span.span_id);
    assert!(client.str("url.full").ends_with("/mcp"));
    // A stateless-era call names no session.
    let modern = serde_json::json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "render", "arguments": {"text": "modern"},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
    let modern_headers = [
        ALICE,
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "render"),
    ];
    let a = http_post(&gw.url("/mcp"), &modern.to_string(), &modern_headers).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let spans = collector.wait_for(2, is_mcp).await;
    let m = spans
        .iter()
        .find(|g| g.str("jsonrpc.request.id") == "9")
        .unwrap();
    assert!(m.attr("mcp.session.id").is_none());
    assert_eq!(m.str("mcp.protocol.version"), "2026-07-28");
}

/// A stdio MCP server (plain Python, no SDK): answers `initialize`, `tools/list` (one
/// tool, `render`) and `tools/call` with a text result holding the call's `params._meta`
/// as JSON, so that the test sees what was forwarded.
const STDIO_SERVER: &str = r#"
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m or "method" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}},
             "serverInfo": {"name": "meta-echo", "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": [{"name": "render", "inputSchema": {"type": "object"}}]}
    elif m["method"] == "tools/call":
        r = {"content": [{"type": "text", "text": json.dumps(m["params"].get("_meta", {}))}]}
    else:
        r = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}) + "\n")
    sys.stdout.flush()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oncely_mcp_over_stdio_has_mcp_spans_continues_meta_and_forwards_the_client_span() {
    use std::io::{BufRead, BufReader, Write};
    let rx = Receiver::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let server = dir.path().join("server.py");
    std::fs::write(&server, STDIO_SERVER).unwrap();
    let store = format!("sqlite://{}", dir.path().join("mcp.db").display());
    let endpoint = rx.http_url();
    let mut child = crate::common::oncely()
        .args([
            "mcp",
            "--store",
            &store,
            "--",
            "python3",
            server.to_str().unwrap(),
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_METRICS_EXPORTER", "none")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |m: serde_json::Value| -> serde_json::Value {
        writeln!(stdin, "{m}").unwrap();
        stdin.flush().unwrap();
        if m.get("id").is_none() {
            return serde_json::Value::Null;
        }
        loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "stdout ended");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["id"] == m["id"] && v.get("method").is_none() {
                return v;
            }
        }
    };
    ask(
        serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params":
        {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
    );
    ask(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let meta_tp = format!("00-{META_TRACE}-{META_SPAN}-01");
    let call = |id: i64| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params":
            {"name": "render", "arguments": {"text": "piped"}, "_meta": {"traceparent": meta_tp}}})
    };
    let first = ask(call(1));
    let second = ask(call(2));
    assert_eq!(
        second["result"]["_meta"]["dev.oncely/replay"]["status"], "replayed",
        "{second}"
    );
    let echoed: serde_json::Value =
        serde_json::from_str(first["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    let forwarded = echoed["traceparent"]
        .as_str()
        .expect("a traceparent in _meta");
    let (trace, parent, _) = parse(forwarded);
    assert_eq!(trace, META_TRACE);

    let servers = rx
        .wait_for(2, |g| {
            g.span.kind == SpanKind::Server as i32 && g.span.name == "tools/call render"
        })
        .await;
    // The handshake is spans too, under the MCP conventions.
    let init = rx
        .wait_for(1, |g| {
            g.span.name == "initialize" && g.span.kind == SpanKind::Server as i32
        })
        .await
        .remove(0);
    assert_eq!(init.str("mcp.method.name"), "initialize");
    assert_eq!(init.str("jsonrpc.request.id"), "0");
    assert_eq!(init.str("network.transport"), "pipe");
    assert!(init.attr("error.type").is_none());
    for s in &servers {
        assert_eq!(hex(&s.span.trace_id), META_TRACE);
        assert_eq!(hex(&s.span.parent_span_id), META_SPAN);
        assert_eq!(s.str("network.transport"), "pipe");
        assert_eq!(s.str("mcp.protocol.version"), "2025-11-25");
        assert_eq!(s.str("mcp.method.name"), "tools/call");
        assert_eq!(s.str("gen_ai.tool.name"), "render");
        assert!(s.attr("jsonrpc.request.id").is_some());
        assert!(
            s.attr("mcp.session.id").is_none(),
            "stdio has no MCP session id"
        );
    }
    let fresh = servers
        .iter()
        .find(|s| s.str("oncely.status") == "fresh")
        .unwrap();
    let client = rx
        .wait_for(1, |g| {
            g.span.kind == SpanKind::Client as i32 && g.span.parent_span_id == fresh.span.span_id
        })
        .await
        .remove(0);
    assert_eq!(client.span.name, "tools/call");
    assert_eq!(hex(&client.span.span_id), parent);
    assert_eq!(client.span.parent_span_id, fresh.span.span_id);
    drop(stdin);
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_guarded_route_takes_is_a_server_span_too() {
    let collector = Collector::new();
    let otlp = collector.addr();
    let seen = Seen::default();
    let up = upstream(render_service(seen.clone()).route(
        "/health",
        axum::routing::get(|headers: HeaderMap| async move {
            headers
                .get("traceparent")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        }),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &[
            "--config",
            &config(dir.path(), up, &tracing_section(otlp, "")),
        ],
        &[],
    );
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let a = get(&gw.url("/health"), &[("traceparent", caller.as_str())]).await;
    assert_eq!(a.status, 200);
    let (trace, parent, _) = parse(&a.text());
    assert_eq!(trace, CALLER_TRACE);
    let server = collector
        .wait_for(1, |g| g.span.kind == SpanKind::Server as i32)
        .await
        .remove(0);
    assert_eq!(server.span.name, "GET", "no route: the method alone");
    assert_eq!(hex(&server.span.parent_span_id), CALLER_SPAN);
    // The upstream call is a client span under it, and the upstream's traceparent names
    // that client span.
    let client = collector
        .wait_for(1, |g| g.span.kind == SpanKind::Client as i32)
        .await
        .remove(0);
    assert_eq!(client.span.parent_span_id, server.span.span_id);
    assert_eq!(hex(&client.span.span_id), parent);
    assert_eq!(client.str("http.request.method"), "GET");
    assert_eq!(client.int("http.response.status_code"), 200);
    assert!(
        client.str("url.full").ends_with("/health"),
        "{}",
        client.str("url.full")
    );
    assert_eq!(server.str("http.request.method"), "GET");
    assert_eq!(server.str("url.path"), "/health");
    assert_eq!(server.int("http.response.status_code"), 200);
    assert!(server.attr("http.route").is_none());
    assert!(server.attr("oncely.record").is_none());
}

/// An MCP server answering as real servers do: `initialize` and `tools/list` in JSON, a
/// notification with 202, `prompts/get` with a JSON-RPC error, the unguarded `lookup`
/// tool with an `isError` result, and `ping` as an event stream. Each request's
/// `traceparent` is noted with its method.
fn every_method_server(seen: Seen) -> axum::Router {
    use axum::response::IntoResponse;
    axum::Router::new()
        .route(
            "/mcp",
            post(
                |State(seen): State<Seen>, headers: HeaderMap, body: String| async move {
                    let m: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let method = m["method"].as_str().unwrap_or_default().to_string();
                    let mut h = HashMap::new();
                    if let Some(v) = headers.get("traceparent") {
                        h.insert("traceparent".into(), v.to_str().unwrap().to_string());
                    }
                    h.insert("method".into(), method.clone());
                    seen.0.lock().unwrap().push(h);
                    let answer = |v: serde_json::Value| {
                        serde_json::json!({"jsonrpc": "2.0", "id": m["id"], "result": v})
                    };
                    match method.as_str() {
                        "initialize" => axum::Json(answer(serde_json::json!({
                            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                            "serverInfo": {"name": "every", "version": "1"}})))
                        .into_response(),
                        "tools/list" => axum::Json(answer(serde_json::json!({"tools": [
                            {"name": "render", "inputSchema": {"type": "object"}},
                            {"name": "lookup", "inputSchema": {"type": "object"}}]})))
                        .into_response(),
                        "prompts/get" => axum::Json(serde_json::json!({"jsonrpc": "2.0",
                            "id": m["id"], "error": {"code": -32602, "message": "no such prompt"}}))
                        .into_response(),
                        "tools/call" => axum::Json(answer(serde_json::json!({"isError": true,
                            "content": [{"type": "text", "text": "not found"}]})))
                        .into_response(),
                        "ping" => (
                            [("content-type", "text/event-stream")],
                            format!(
                                "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"level\":\"info\",\"data\":\"x\"}}}}\n\nevent: message\ndata: {}\n\n",
                                answer(serde_json::json!({}))
                            ),
                        )
                            .into_response(),
                        _ => http::StatusCode::ACCEPTED.into_response(),
                    }
                },
            ),
        )
        .with_state(seen)
}

/// Every MCP message, not only a guarded call, is a server span named by its method (and
/// target), with the MCP attributes, ended with its answer: a JSON-RPC error's code and an
/// `isError` result are its `error.type`, a streamed answer is read on the way and passes
/// unchanged, and the server gets a `traceparent` naming the message's client span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mcp_message_is_a_server_span_ended_with_its_answer() {
    let seen = Seen::default();
    let (collector, gw, _dir) =
        mcp_gateway_of(every_method_server(seen.clone()), "tools = [\"render\"]").await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let headers = [
        ALICE,
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("traceparent", caller.as_str()),
        ("mcp-protocol-version", "2025-06-18"),
        ("mcp-session-id", "sess-1"),
    ];
    let send = |m: serde_json::Value| {
        let url = gw.url("/mcp");
        async move { http_post(&url, &m.to_string(), &headers).await }
    };
    let a = send(
        serde_json::json!({"jsonrpc": "2.0", "id": "init", "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let a =
        send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    assert_eq!(a.status, 202);
    let a = send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    assert!(a.text().contains("lookup"), "{}", a.text());
    let a = send(
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "prompts/get",
        "params": {"name": "summary"}}),
    )
    .await;
    assert!(a.text().contains("-32602"), "{}", a.text());
    let a = send(
        serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "lookup", "arguments": {}}}),
    )
    .await;
    assert!(a.text().contains("not found"), "{}", a.text());
    assert!(
        a.headers.get("oncely-status").is_none(),
        "lookup is not guarded"
    );
    let a = send(serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "ping"})).await;
    assert!(
        a.text().contains("notifications/message") && a.text().contains("\"id\":5"),
        "the event stream passes whole: {}",
        a.text()
    );

    let servers = collector.wait_for(6, is_mcp).await;
    let by_name = |name: &str| {
        servers
            .iter()
            .find(|s| s.span.name == name)
            .unwrap_or_else(|| {
                let names: Vec<&str> = servers.iter().map(|s| s.span.name.as_str()).collect();
                panic!("no span {name:?} in {names:?}")
            })
    };
    for (name, method, id) in [
        ("initialize", "initialize", Some("init")),
        (
            "notifications/initialized",
            "notifications/initialized",
            None,
        ),
        ("tools/list", "tools/list", Some("2")),
        ("prompts/get summary", "prompts/get", Some("3")),
        ("tools/call lookup", "tools/call", Some("4")),
        ("ping", "ping", Some("5")),
    ] {
        let s = by_name(name);
        assert_eq!(s.str("mcp.method.name"), method, "{name}");
        assert_eq!(s.str("network.transport"), "tcp", "{name}");
        assert_eq!(s.str("mcp.protocol.version"), "2025-06-18", "{name}");
        assert_eq!(s.str("mcp.session.id"), "sess-1", "{name}");
        assert_eq!(hex(&s.span.trace_id), CALLER_TRACE, "{name}");
        assert_under_http_span(&collector, s).await;
        match id {
            Some(id) => assert_eq!(s.str("jsonrpc.request.id"), id, "{name}"),
            None => assert!(s.attr("jsonrpc.request.id").is_none(), "{name}"),
        }
        assert!(s.attr("oncely.record").is_none(), "{name}: no record");
    }
    for quiet in [
        "initialize",
        "tools/list",
        "ping",
        "notifications/initialized",
    ] {
        assert!(by_name(quiet).attr("error.type").is_none(), "{quiet}");
    }
    let prompt = by_name("prompts/get summary");
    assert_eq!(prompt.str("error.type"), "-32602");
    assert_eq!(prompt.str("rpc.response.status_code"), "-32602");
    assert_eq!(prompt.str("gen_ai.prompt.name"), "summary");
    assert_eq!(
        prompt.span.status.as_ref().unwrap().message,
        "no such prompt"
    );
    let lookup = by_name("tools/call lookup");
    assert_eq!(lookup.str("error.type"), "tool_error");
    assert_eq!(lookup.str("gen_ai.tool.name"), "lookup");
    assert_eq!(lookup.str("gen_ai.operation.name"), "execute_tool");
    assert!(by_name("tools/list")
        .attr("gen_ai.operation.name")
        .is_none());

    // Each message sent on carries the traceparent of its client span, a child of the
    // message's server span.
    let calls = seen.calls();
    assert_eq!(calls.len(), 6, "{calls:?}");
    let clients = collector
        .wait_for(6, |g| g.span.kind == SpanKind::Client as i32)
        .await;
    for call in &calls {
        let (trace, parent, _) = parse(&call["traceparent"]);
        assert_eq!(trace, CALLER_TRACE);
        let client = clients
            .iter()
            .find(|c| hex(&c.span.span_id) == parent)
            .unwrap_or_else(|| panic!("no client span for {}", call["method"]));
        let server = servers
            .iter()
            .find(|s| s.span.span_id == client.span.parent_span_id)
            .expect("the client span's parent is a message's server span");
        assert_eq!(server.str("mcp.method.name"), call["method"]);
    }
}

/// A route's resends are client spans of their own (the HTTP conventions): each attempt
/// is a sibling under the server span, with its status, `http.request.resend_count` on
/// each resend, and the `traceparent` the upstream got with that attempt names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_resend_of_a_route_is_a_client_span_with_its_resend_count() {
    let collector = Collector::new();
    let hits: Arc<Mutex<Vec<String>>> = Arc::default();
    let up = upstream(
        axum::Router::new()
            .route(
                "/v1/flaky",
                axum::routing::get(
                    |State(hits): State<Arc<Mutex<Vec<String>>>>, headers: HeaderMap| async move {
                        let tp = headers["traceparent"].to_str().unwrap().to_string();
                        let n = {
                            let mut hits = hits.lock().unwrap();
                            hits.push(tp);
                            hits.len()
                        };
                        let status = if n < 3 { 503 } else { 200 };
                        (
                            http::StatusCode::from_u16(status).unwrap(),
                            format!("attempt {n}"),
                        )
                    },
                ),
            )
            .with_state(hits.clone()),
    )
    .await;
    let (gw, _dir) = gateway_of(
        &format!("upstream = \"http://{up}\"\n[[routes]]\nmethod = \"GET\"\npath = \"/v1/flaky\"\nclass = \"read\"\nretries = 2\nretry_backoff = \"10ms\""),
        &collector,
    );
    let a = get(&gw.url("/v1/flaky"), &[]).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.text(), "attempt 3");
    let hits = hits.lock().unwrap().clone();
    assert_eq!(hits.len(), 3, "two resends");

    let server = collector
        .wait_for(1, |g| g.span.kind == SpanKind::Server as i32)
        .await
        .remove(0);
    assert_eq!(server.int("http.response.status_code"), 200);
    let mut clients = collector
        .wait_for(3, |g| g.span.kind == SpanKind::Client as i32)
        .await;
    assert_eq!(clients.len(), 3);
    clients.sort_by_key(|c| c.span.start_time_unix_nano);
    let mut ids = std::collections::HashSet::new();
    for (n, (client, sent)) in clients.iter().zip(&hits).enumerate() {
        assert_eq!(
            client.span.parent_span_id, server.span.span_id,
            "attempt {n}"
        );
        assert_eq!(client.span.trace_id, server.span.trace_id);
        let (_, parent, _) = parse(sent);
        assert_eq!(
            hex(&client.span.span_id),
            parent,
            "attempt {n} names its span"
        );
        assert!(
            ids.insert(client.span.span_id.clone()),
            "one span an attempt"
        );
        assert!(client.span.end_time_unix_nano >= client.span.start_time_unix_nano);
        match n {
            0 => assert!(client.attr("http.request.resend_count").is_none()),
            n => assert_eq!(client.int("http.request.resend_count"), n as i64),
        }
        let want = if n < 2 { 503 } else { 200 };
        assert_eq!(client.int("http.response.status_code"), want, "attempt {n}");
        if want == 503 {
            assert_eq!(client.str("error.type"), "503");
        } else {
            assert!(client.attr("error.type").is_none());
        }
        assert!(client.str("url.full").ends_with("/v1/flaky"));
    }
    // Attempts follow one another: each starts after the one before it ended.
    for w in clients.windows(2) {
        assert!(w[1].span.start_time_unix_nano >= w[0].span.end_time_unix_nano);
    }
}
