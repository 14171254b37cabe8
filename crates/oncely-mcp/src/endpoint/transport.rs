//! The HTTP transport of an endpoint: reads one request (its body under the limit, its
//! session, its method) and routes it: a cancellation of a guarded call in flight is
//! dropped, a session's end is held back while calls this endpoint owns run on it, a
//! guarded `tools/call` goes to the guard, a batch is split, the tasks extension's requests
//! are checked and answered or forwarded, and everything else is forwarded.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use oncely_tower::RequestHead;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::batch::batch;
use super::call::{read_call, unreadable_call};
use super::forward::{forward, AnswerEdit, EDIT_LIMIT};
use super::guarded::guard;
use super::headers::{header_mismatch, header_str, is_modern, NAME, TASK_ID};
use super::response::{empty, json_response, messages_in};
use super::state::Inner;
use super::task_requests::{self, task_not_found, TaskAnswer};
use crate::body::{full, McpBody};
use crate::jsonrpc::code;
use crate::jsonrpc::{self, Outcome};
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
                                &jsonrpc::error_message(
                                    request.id,
                                    code::HEADER_MISMATCH,
                                    &mismatch,
                                ),
                            );
                        }
                        let head = RequestHead::of_parts(&parts);
                        let modern = is_modern(&parts.headers);
                        if let Some(call) = read_call(&inner, &head, modern, &message, text) {
                            return guard(inner, &parts, bytes, call, &session).await;
                        }
                    }
                    "tools/list" => edits.push((request.id.clone(), AnswerEdit::ToolsList)),
                    "server/discover" => {
                        edits.push((request.id.clone(), AnswerEdit::Discover));
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

/// `tasks/get`, `tasks/cancel` or `tasks/update` of the 2026-07-28 extension. Checked
/// as the extension says (routing headers, then the declared extension and a known task
/// of this principal, see [`task_requests::answer`]) before anything else; this
/// endpoint's tasks (`rec_…`) are answered from the ledger, any other task id is the
/// server's own and is forwarded.
async fn task_request(
    inner: Arc<Inner>,
    parts: http::request::Parts,
    bytes: Bytes,
    message: Value,
) -> Response<McpBody> {
    let Some(request) = jsonrpc::as_request(&message) else {
        return forward(inner, parts, bytes, Vec::new()).await;
    };
    if let Some(mismatch) = header_mismatch(&parts.headers, &message, TASK_ID) {
        return json_response(
            StatusCode::BAD_REQUEST,
            &jsonrpc::error_message(request.id, code::HEADER_MISMATCH, &mismatch),
        );
    }
    let head = RequestHead::of_parts(&parts);
    let principal = || {
        inner
            .config
            .principal
            .make_principal(&head)
            .map(|raw| inner.guard.principal_hash(&raw))
    };
    let answer = task_requests::answer(&inner, &request, principal).await;
    match answer {
        TaskAnswer::AnswerEdit(message) => json_response(StatusCode::OK, &message),
        // As the 2026-07-28 transport answers a protocol error.
        TaskAnswer::Refused(message) => json_response(StatusCode::BAD_REQUEST, &message),
        TaskAnswer::Forward => {
            let id = request.id.clone();
            forward_task_request(inner, parts, bytes, id).await
        }
    }
}

/// A `tasks/*` request naming a task that is not one of oncely's: the server's own. Its
/// answer passes back, except that a server that does not know the task, or does not
/// speak the extension at all (HTTP 404/405, JSON-RPC -32601), is answered -32602 as
/// the extension requires.
async fn forward_task_request(
    inner: Arc<Inner>,
    parts: http::request::Parts,
    bytes: Bytes,
    id: Value,
) -> Response<McpBody> {
    let resp = forward(inner, parts, bytes, Vec::new()).await;
    let status = resp.status();
    let (rparts, body) = resp.into_parts();
    let Some(bytes) = collect_limited(body, EDIT_LIMIT).await else {
        return json_response(
            StatusCode::OK,
            &jsonrpc::error_message(
                &id,
                code::INTERNAL_ERROR,
                "the MCP server's answer broke off",
            ),
        );
    };
    let unknown_method = messages_in(&rparts.headers, &bytes).iter().any(|m| {
        matches!(jsonrpc::response_to(m, &id), Some(Outcome::Error(e)) if e.get("code") == Some(&json!(code::METHOD_NOT_FOUND)))
    });
    let not_served = matches!(status.as_u16(), 404 | 405 | 501);
    if unknown_method || not_served {
        return json_response(StatusCode::OK, &task_not_found(&id, "Task not found"));
    }
    Response::from_parts(rparts, full(bytes))
}

/// A whole body of at most `limit` bytes; `None` when it is larger or breaks off.
async fn collect_limited(mut body: McpBody, limit: usize) -> Option<Bytes> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.ok()?.into_data() {
            if out.len() + data.len() > limit {
                return None;
            }
            out.extend_from_slice(&data);
        }
    }
    Some(out.into())
}
