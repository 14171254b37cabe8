//! The HTTP responses an endpoint writes itself (JSON, empty, problem+json, a cancelled
//! request's event stream, oncely's marks on an answer) and the JSON-RPC messages read out
//! of a whole answer.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use oncely_core::Record;
use oncely_http::problem::{Problem, ProblemCode, ONCELY_RECORD, ONCELY_STATUS};
use serde_json::Value;

use super::headers::header_str;
use crate::body::{full, McpBody};
use crate::jsonrpc;
use crate::sse;

/// The JSON-RPC messages of a whole answer body: one message, a batch, or an event stream.
pub(super) fn messages_in(headers: &HeaderMap, body: &[u8]) -> Vec<Value> {
    let is_sse = header_str(headers, "content-type")
        .is_some_and(|c| c.to_ascii_lowercase().starts_with("text/event-stream"));
    if is_sse {
        let mut parser = sse::Parser::new(body.len() + 1);
        let mut events = parser.feed(body);
        events.extend(parser.feed(b"\n\n"));
        return events
            .iter()
            .filter_map(|e| jsonrpc::parse(e.data.as_bytes()))
            .collect();
    }
    // `jsonrpc::parse`: an answer with a number serde_json refuses (`1e400`) is still
    // one (that number read as its canonical text), not an answer without a response.
    match jsonrpc::parse(body) {
        Some(Value::Array(items)) => items,
        Some(v) => vec![v],
        None => Vec::new(),
    }
}

/// Marks an answer with oncely's status for it and its record.
pub(super) fn mark(headers: &mut HeaderMap, status: &str, record: &Record) {
    if let Ok(v) = HeaderValue::from_str(status) {
        headers.insert(ONCELY_STATUS, v);
    }
    if let Ok(v) = HeaderValue::from_str(record.id.as_str()) {
        headers.insert(ONCELY_RECORD, v);
    }
    if status == "fresh" {
        headers.remove(http::header::CONTENT_LENGTH);
    }
}

/// A JSON answer of `value`.
pub(super) fn json_response(status: StatusCode, value: &Value) -> Response<McpBody> {
    let mut resp = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A problem+json answer (the one renderer, `oncely_http::problem`).
pub(super) fn problem(code: ProblemCode, detail: &str) -> Response<McpBody> {
    Problem::new(code, detail).into_response()
}

/// The answer to a request its client cancelled: an event stream without the response.
pub(super) fn cancelled_answer() -> Response<McpBody> {
    let mut resp = Response::new(full(Bytes::new()));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    resp
}

/// An answer without a body.
pub(super) fn empty(status: StatusCode) -> Response<McpBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = status;
    resp
}
