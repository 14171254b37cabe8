//! The one log line of a guarded request and its count in `oncely_requests_total`.
//!
//! HTTP routes, jobs the worker ended and MCP tool calls all end here, so every request
//! line has target [`TARGET`] and the contract's fields ([`FIELDS`]; the binary's JSON
//! format writes an absent one as `null`), and every count has the labels
//! `docs/metrics.md` gives: `route` and `status`, plus `tool` for MCP calls.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

/// The target of the request line.
pub const TARGET: &str = "oncely::request";

/// The keys of the request line the contract names, in its order.
pub const FIELDS: [&str; 9] = [
    "record",
    "route",
    "principal",
    "status",
    "attempt",
    "workflow_id",
    "upstream_status",
    "provider_request_id",
    "duration_ms",
];

/// The fields of one request line.
#[derive(Debug, Clone, Default)]
pub struct RequestLine<'a> {
    /// The ledger record (none for a request refused or bypassed before its claim).
    pub record: Option<&'a str>,
    /// The route's name (`METHOD PATTERN`; for MCP `PATH#TOOL`).
    pub route: &'a str,
    /// The principal's hash.
    pub principal: Option<&'a str>,
    /// `Oncely-Status` (fresh, replayed, joined, bypassed), a problem code, or a job's
    /// status.
    pub status: &'static str,
    /// The record's attempt.
    pub attempt: Option<u32>,
    /// From `X-Workflow-Id` or the W3C `traceparent`.
    pub workflow_id: Option<&'a str>,
    /// The upstream's status, when it answered.
    pub upstream_status: Option<u16>,
    /// The upstream's `Request-Id` or `X-Request-Id`.
    pub provider_request_id: Option<&'a str>,
    /// Time from the request's arrival to its answer.
    pub duration_ms: u64,
    /// The tool of an MCP call (logged; the count uses [`Counted::tool`]).
    pub tool: Option<&'a str>,
}

/// The labels a line is counted under when they are not the line's own route and status
/// (MCP: a tool no listing or config named counts as `other`, so labels stay bounded).
#[derive(Debug, Clone, Copy)]
pub struct Counted<'a> {
    /// The `route` label.
    pub route: &'a str,
    /// The `tool` label.
    pub tool: &'a str,
}

impl RequestLine<'_> {
    /// Logs the line with `message` and counts it under its route and status.
    pub fn emit(&self, message: &'static str) {
        self.log(message);
        request_counter(self.route, self.status).increment(1);
    }

    /// Logs the line with `message` and counts it under `counted` (and its status).
    pub fn emit_counted_as(&self, message: &'static str, counted: Counted<'_>) {
        self.log(message);
        metrics::counter!(
            "oncely_requests_total",
            "route" => counted.route.to_string(),
            "status" => self.status,
            "tool" => counted.tool.to_string()
        )
        .increment(1);
    }

    fn log(&self, message: &'static str) {
        tracing::info!(
            target: "oncely::request",
            record = self.record,
            route = self.route,
            tool = self.tool,
            principal = self.principal,
            status = self.status,
            attempt = self.attempt,
            workflow_id = self.workflow_id,
            upstream_status = self.upstream_status,
            provider_request_id = self.provider_request_id,
            duration_ms = self.duration_ms,
            "{message}"
        );
    }
}

/// Handles of `oncely_requests_total` by route and status, so that counting a request
/// allocates no label strings and looks nothing up in the recorder's registry. A handle
/// comes from the recorder installed when its (route, status) is first counted: install
/// the recorder before serving.
type Counters = HashMap<String, HashMap<&'static str, metrics::Counter>>;

static COUNTERS: OnceLock<RwLock<Counters>> = OnceLock::new();

/// The counter of requests on `route` answered `status` (also used to give each
/// configured route its first value at start).
pub fn request_counter(route: &str, status: &'static str) -> metrics::Counter {
    let counters = COUNTERS.get_or_init(Default::default);
    if let Some(c) = counters
        .read()
        .expect("request counters lock")
        .get(route)
        .and_then(|by_status| by_status.get(status))
    {
        return c.clone();
    }
    let counter = metrics::counter!(
        "oncely_requests_total",
        "route" => route.to_string(),
        "status" => status
    );
    counters
        .write()
        .expect("request counters lock")
        .entry(route.to_string())
        .or_default()
        .entry(status)
        .or_insert(counter)
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects the formatted lines of the subscriber set for one test.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn one_line_with_the_contract_fields_and_one_count() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_writer(move || writer.clone())
            .finish();
        let http = RequestLine {
            record: Some("rec_1"),
            route: "POST /v1/render",
            principal: Some("p_1"),
            status: "fresh",
            attempt: Some(1),
            workflow_id: Some("wf-1"),
            upstream_status: Some(201),
            provider_request_id: Some("req_9"),
            duration_ms: 12,
            tool: None,
        };
        let mcp = RequestLine {
            route: "/mcp#render",
            status: "replayed",
            tool: Some("render"),
            ..RequestLine::default()
        };
        metrics::with_local_recorder(&recorder, || {
            tracing::subscriber::with_default(subscriber, || {
                http.emit("guarded request");
                mcp.emit_counted_as(
                    "mcp tools/call",
                    Counted {
                        route: "/mcp#other",
                        tool: "other",
                    },
                );
            })
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let docs: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(docs.len(), 2, "{text}");
        let first = &docs[0];
        assert_eq!(first["target"], TARGET);
        assert_eq!(first["message"], "guarded request");
        for field in FIELDS {
            assert!(first.get(field).is_some(), "{field} missing: {first}");
        }
        assert_eq!(first["upstream_status"], 201);
        assert_eq!(first["provider_request_id"], "req_9");
        assert!(first.get("tool").is_none());
        let second = &docs[1];
        assert_eq!(second["target"], TARGET);
        assert_eq!(second["tool"], "render");
        assert_eq!(second["route"], "/mcp#render");
        // An absent value is left out (the binary's JSON format writes it as null).
        assert!(second.get("upstream_status").is_none());

        let metrics = handle.render();
        assert!(
            metrics.contains(r#"oncely_requests_total{route="POST /v1/render",status="fresh"} 1"#),
            "{metrics}"
        );
        assert!(
            metrics.contains(
                r#"oncely_requests_total{route="/mcp#other",status="replayed",tool="other"} 1"#
            ),
            "{metrics}"
        );
    }
}
