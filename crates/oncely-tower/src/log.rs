//! The fields of the one log line of a guarded request (and of a job's run); the line and
//! the request counter are `oncely_http::request_log`'s.

use std::time::Instant;

use http::HeaderMap;

use crate::trace::Span;

pub(crate) fn provider_request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("request-id")
        .or_else(|| headers.get("x-request-id"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The fields of the one log line of a guarded request.
#[derive(Debug)]
pub(crate) struct RequestLog<'a> {
    pub(crate) record: Option<String>,
    pub(crate) route: &'a str,
    pub(crate) principal: Option<&'a str>,
    pub(crate) status: &'static str,
    pub(crate) attempt: Option<u32>,
    pub(crate) workflow_id: Option<&'a str>,
    pub(crate) upstream_status: Option<u16>,
    pub(crate) provider_request_id: Option<String>,
    pub(crate) started: Instant,
    /// The request's server span, ended with the line (traces on).
    pub(crate) span: Option<Span>,
}

/// One log line (target `oncely::request`) and the request counter (`oncely_http::request_log`).
pub(crate) fn log_request(log: &RequestLog<'_>) {
    log_line(log, "guarded request")
}

/// The line of a job's run ended by the worker (see the `jobs` module): the same fields,
/// with the job's status, and counted like a request.
pub(crate) fn log_job(log: &RequestLog<'_>) {
    log_line(log, "job finished")
}

fn log_line(log: &RequestLog<'_>, message: &'static str) {
    oncely_http::request_log::RequestLine {
        record: log.record.as_deref(),
        route: log.route,
        principal: log.principal,
        status: log.status,
        attempt: log.attempt,
        workflow_id: log.workflow_id,
        upstream_status: log.upstream_status,
        provider_request_id: log.provider_request_id.as_deref(),
        duration_ms: log.started.elapsed().as_millis() as u64,
        tool: None,
    }
    .emit(message);
}
