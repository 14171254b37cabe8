//! The HTTP transport of an endpoint: reads one request (its body under the limit, its
//! session, its method) and routes it: a cancellation of a guarded call in flight is
//! dropped, a session's end is held back while calls this endpoint owns run on it, a
//! guarded `tools/call` goes to the guard, a batch is split, the tasks extension's requests
//! go to their handler, and everything else is forwarded.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::time::Instant;

use super::batch::batch;
use super::call::{read_call, unreadable_call};
use super::forward::{forward, Answer};
use super::guarded::guard;
use super::headers::{header_mismatch, header_str, is_modern, HEADER_MISMATCH, NAME};
use super::response::{empty, json_response};
use super::state::Inner;
use super::task_requests::task_request;
use crate::body::McpBody;
use crate::jsonrpc;
use crate::BoxError;

/// Answers one request.
pub(super) async fn handle<B>(inner: Arc<Inner>, req: Request<B>) -> Response<McpBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let bytes =
        match oncely_tower::read_body(body, &parts.headers, inner.config.max_body as u64).await {
            Ok(bytes) => bytes,
            Err(p) => return p.into_response().map(|b| b.boxed()),
        };
    let session = header_str(&parts.headers, "mcp-session-id").map(str::to_string);
    if parts.method == Method::DELETE {
        if let Some(session) = session.clone().filter(|s| inner.sessions.owns_calls_on(s)) {
            return end_session_later(inner, parts, bytes, session);
        }
    }
    if parts.method != Method::POST {
        return forward(inner, parts, bytes, Vec::new()).await;
    }
    let mut edits = Vec::new();
    match jsonrpc::parse(&bytes) {
        Some(message @ Value::Object(_)) => {
            if let Some(target) = jsonrpc::cancelled_request_id(&message) {
                if inner.sessions.is_guarded_in_flight(&session, &target) {
                    tracing::info!(route = %inner.config.path, request_id = %target,
                        "dropped a cancellation of a guarded tools/call: the call runs to its end");
                    return empty(StatusCode::ACCEPTED);
                }
            }
            let text = std::str::from_utf8(&bytes).unwrap_or_default();
            if let Some(refusal) = unreadable_call(&message, text) {
                return json_response(StatusCode::BAD_REQUEST, &refusal);
            }
            if let Some(request) = jsonrpc::as_request(&message) {
                match request.method {
                    "tools/call" => {
                        if let Some(mismatch) = header_mismatch(&parts.headers, &message, NAME) {
                            return json_response(
                                StatusCode::BAD_REQUEST,
                                &jsonrpc::error_message(request.id, HEADER_MISMATCH, &mismatch),
                            );
                        }
                        if let Some(call) = read_call(&inner, &parts, &message, text) {
                            return guard(inner, &parts, bytes, call, &session).await;
                        }
                    }
                    "tools/list" => edits.push((request.id.clone(), Answer::ToolsList)),
                    "server/discover" => {
                        edits.push((request.id.clone(), Answer::Discover));
                    }
                    method if method.starts_with("tasks/") && is_modern(&parts.headers) => {
                        return task_request(inner, parts, bytes, message).await;
                    }
                    _ => {}
                }
            }
        }
        Some(Value::Array(items)) => return batch(inner, parts, bytes, items, session).await,
        _ => {}
    }
    forward(inner, parts, bytes, edits).await
}

/// A client ends its session (`DELETE`) while upstream calls this endpoint owns run on
/// it: the upstream would abort them (and a retry would pay again). The client's
/// session ends now (answered 200); the upstream session ends once those calls are
/// done and recorded (or after `timeout`, when they cannot still be running).
fn end_session_later(
    inner: Arc<Inner>,
    parts: http::request::Parts,
    bytes: Bytes,
    session: String,
) -> Response<McpBody> {
    tracing::info!(route = %inner.config.path, session = %session,
        "session end held back until its guarded tools/call calls are done");
    let me = inner.clone();
    tokio::spawn(async move {
        let deadline = Instant::now() + me.config.timeout + Duration::from_secs(5);
        me.sessions.owned_calls_done(&session, deadline).await;
        let resp = forward(me.clone(), parts, bytes, Vec::new()).await;
        tracing::info!(route = %me.config.path, session = %session,
            status = resp.status().as_u16(), "held session end forwarded");
    });
    empty(StatusCode::OK)
}
