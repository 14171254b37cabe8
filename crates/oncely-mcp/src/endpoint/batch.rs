//! A JSON-RPC batch (protocol 2025-03-26 only; batching was removed in 2025-06-18), split
//! so that each guarded `tools/call` goes through the guard on its own: the rest is
//! forwarded as a smaller batch, and the answers are joined into one JSON array.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use oncely_tower::RequestHead;
use serde_json::Value;

use super::call::{read_call, unreadable_call};
use super::forward::{forward, AnswerEdit};
use super::guarded::guard;
use super::headers::is_modern;
use super::response::{empty, json_response, messages_in};
use super::state::Inner;
use crate::body::McpBody;
use crate::jsonrpc;
use crate::jsonrpc::code;

/// A JSON-RPC batch (2025-03-26). Cancellations of guarded calls are taken out; each
/// guarded `tools/call` goes through the guard on its own (forwarded as a single
/// message); the rest is forwarded as a smaller batch; the answers are joined into one
/// JSON array. A batch without a guarded call is forwarded as it came (streamed).
pub(super) async fn batch(
    inner: Arc<Inner>,
    parts: http::request::Parts,
    bytes: Bytes,
    items: Vec<Value>,
    session: Option<String>,
) -> Response<McpBody> {
    let mut rest = Vec::new();
    let mut rest_texts = Vec::new();
    let mut calls = Vec::new();
    let mut refused = Vec::new();
    let mut dropped = false;
    // Each item as it was written: what is forwarded, and what a guarded call's
    // arguments are fingerprinted from (a parsed `Value` rounds long numbers).
    let texts = std::str::from_utf8(&bytes)
        .ok()
        .and_then(jsonrpc::batch_texts)
        .filter(|t| t.len() == items.len())
        .map(|t| t.into_iter().map(str::to_string).collect::<Vec<_>>())
        .unwrap_or_else(|| items.iter().map(Value::to_string).collect());
    for (item, text) in items.into_iter().zip(texts) {
        if jsonrpc::cancelled_request_id(&item)
            .is_some_and(|id| inner.sessions.is_guarded_in_flight(&session, &id))
        {
            dropped = true;
            continue;
        }
        if let Some(refusal) = unreadable_call(&item, &text) {
            refused.push(refusal);
            dropped = true;
            continue;
        }
        let call = jsonrpc::as_request(&item).filter(|r| r.method == "tools/call");
        let guarded = call.and_then(|_| {
            let head = RequestHead::of_parts(&parts);
            read_call(&inner, &head, is_modern(&parts.headers), &item, &text)
        });
        match guarded {
            Some(call) => calls.push((text, call)),
            None => {
                rest.push(item);
                rest_texts.push(text);
            }
        }
    }
    let rest_bytes = Bytes::from(format!("[{}]", rest_texts.join(",")));
    let edits: Vec<(Value, AnswerEdit)> = rest
        .iter()
        .filter_map(jsonrpc::as_request)
        .filter(|r| r.method == "tools/list")
        .map(|r| (r.id.clone(), AnswerEdit::ToolsList))
        .collect();
    if calls.is_empty() && refused.is_empty() {
        if rest.is_empty() {
            return empty(StatusCode::ACCEPTED);
        }
        let bytes = if dropped { rest_bytes } else { bytes };
        return forward(inner, parts, bytes, edits).await;
    }
    let expects_answer = rest.iter().any(|m| jsonrpc::as_request(m).is_some());
    let forwarded = async {
        if rest.is_empty() {
            return Vec::new();
        }
        let resp = forward(inner.clone(), parts.clone(), rest_bytes, edits).await;
        let ids: Vec<Value> = rest
            .iter()
            .filter_map(|m| jsonrpc::as_request(m).map(|r| r.id.clone()))
            .collect();
        responses_of(resp, &ids).await
    };
    let guarded = futures::future::join_all(calls.into_iter().map(|(text, call)| {
        let me = inner.clone();
        let parts = parts.clone();
        let session = session.clone();
        async move {
            let id = call.id.clone();
            let resp = guard(me, &parts, Bytes::from(text), call, &session).await;
            responses_of(resp, std::slice::from_ref(&id)).await
        }
    }));
    let (mut answers, guarded) = tokio::join!(forwarded, guarded);
    answers.extend(guarded.into_iter().flatten());
    answers.extend(refused);
    if answers.is_empty() && !expects_answer {
        return empty(StatusCode::ACCEPTED);
    }
    json_response(StatusCode::OK, &Value::Array(answers))
}

/// Reads a whole answer and returns the responses to `ids` in it; an id without one gets a
/// JSON-RPC error that says why (for answers joined into a batch).
async fn responses_of(resp: Response<McpBody>, ids: &[Value]) -> Vec<Value> {
    let status = resp.status();
    let (parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let messages = messages_in(&parts.headers, &bytes);
    ids.iter()
        .map(|id| {
            messages
                .iter()
                .find(|m| {
                    m.get("id") == Some(id)
                        && !m.as_object().is_some_and(|o| o.contains_key("method"))
                })
                .cloned()
                .unwrap_or_else(|| {
                    jsonrpc::error_message(
                        id,
                        code::INTERNAL_ERROR,
                        &format!(
                            "no response (HTTP {}): {}",
                            status.as_u16(),
                            String::from_utf8_lossy(&bytes)
                        ),
                    )
                })
        })
        .collect()
}
