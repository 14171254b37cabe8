//! The HTTP answer to a core's [`Reply`]: a JSON message, an empty 202, a protocol
//! refusal (400), a cancelled request's empty event stream, a problem+json, or the
//! server's answer streamed with its own status and headers (edited on the way, marked
//! with oncely's status, ended when its client cancels).

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use oncely_http::problem::{
    Problem, ProblemCode, IDEMPOTENT_REPLAYED, ONCELY_RECORD, ONCELY_STATUS,
};
use serde_json::Value;

use super::headers::header_str;
use crate::body::{full, Edit, UntilCancelled};
use crate::core::edit::EDIT_LIMIT;
use crate::core::{Framing, Mark, Reply};
use crate::BoxBody;

/// The HTTP answer to `reply`.
pub(super) fn render(reply: Reply<http::response::Parts>) -> Response<BoxBody> {
    match reply {
        Reply::Message(message, mark) => {
            let mut resp = json_response(StatusCode::OK, &message);
            if let Some(mark) = mark {
                put_mark(resp.headers_mut(), &mark);
            }
            resp
        }
        Reply::Refused(message) => json_response(StatusCode::BAD_REQUEST, &message),
        Reply::Accepted => empty(StatusCode::ACCEPTED),
        Reply::Cancelled => cancelled_answer(),
        Reply::Failed { code, detail, .. } => problem(code, &detail),
        Reply::Server {
            answer,
            edit,
            mark,
            cancel,
        } => {
            let mut head = answer.head;
            let length = header_str(&head.headers, "content-length").and_then(|l| l.parse().ok());
            let mut body: BoxBody = oncely_tower::body::streamed(answer.body, length);
            if let Some(edit) = edit.filter(|_| head.status.is_success()) {
                // An edited answer has another length.
                head.headers.remove(CONTENT_LENGTH);
                let is_sse = answer.framing == Framing::EventStream;
                body = Edit::new(body, is_sse, EDIT_LIMIT, edit).boxed();
            }
            if let Some(mark) = mark {
                put_mark(&mut head.headers, &mark);
            }
            if let Some(cancel) = cancel {
                body = UntilCancelled::new(body, cancel).boxed();
            }
            Response::from_parts(head, body)
        }
    }
}

/// Marks an answer with oncely's status for it and its record.
fn put_mark(headers: &mut HeaderMap, mark: &Mark) {
    if let Some(v) = mark.status.and_then(|s| HeaderValue::from_str(s).ok()) {
        headers.insert(ONCELY_STATUS, v);
    }
    if let Ok(v) = HeaderValue::from_str(&mark.record) {
        headers.insert(ONCELY_RECORD, v);
    }
    if mark.status == Some("fresh") {
        headers.remove(CONTENT_LENGTH);
    }
    if mark.replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    if let Some(after) = mark.retry_after {
        headers.insert("retry-after", HeaderValue::from(after));
    }
}

/// A JSON answer of `value`.
pub(super) fn json_response(status: StatusCode, value: &Value) -> Response<BoxBody> {
    let mut resp = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A problem+json answer (the one renderer, `oncely_http::problem`), its code in
/// `Oncely-Status` as every error of the gateway's own.
pub(super) fn problem(code: ProblemCode, detail: &str) -> Response<BoxBody> {
    let mut resp = Problem::new(code, detail).into_response();
    resp.headers_mut()
        .insert(ONCELY_STATUS, HeaderValue::from_static(code.as_str()));
    resp
}

/// The answer to a request its client cancelled: an event stream without the response.
fn cancelled_answer() -> Response<BoxBody> {
    let mut resp = Response::new(full(Bytes::new()));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    resp
}

/// An answer without a body.
pub(super) fn empty(status: StatusCode) -> Response<BoxBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = status;
    resp
}
