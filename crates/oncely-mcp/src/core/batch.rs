//! A JSON-RPC batch (protocol 2025-03-26 only; batching was removed in 2025-06-18), split
//! so that each guarded `tools/call` goes through the guard on its own: the rest is
//! forwarded as a smaller batch, and the answers are joined into one JSON array.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::call::{read_call, unreadable_call};
use super::edit::AnswerEdit;
use super::message_span::{self, MessageSpan};
use super::server::{messages_in, read_whole};
use super::{Context, Core, Reply, Server};
use crate::jsonrpc;
use crate::jsonrpc::code;

impl<S: Server> Core<S> {
    /// A JSON-RPC batch (2025-03-26). Cancellations of guarded calls are taken out; each
    /// guarded `tools/call` goes through the guard on its own (sent as a single message);
    /// the rest is sent as a smaller batch; the answers are joined into one JSON array. A
    /// batch without a guarded call is sent as it came (its answer streamed).
    pub(super) async fn batch(
        self: Arc<Self>,
        bytes: Bytes,
        items: Vec<Value>,
        context: Context<S::Origin>,
    ) -> Reply<S::Head> {
        let session = &context.session;
        let mut rest = Vec::new();
        let mut rest_texts = Vec::new();
        let mut calls = Vec::new();
        let mut refused = Vec::new();
        let mut dropped = false;
        // The spans of the requests sent on as the smaller batch (traces on).
        let mut rest_spans = Vec::new();
        // Each item as it was written: what is sent, and what a guarded call's
        // arguments are fingerprinted from (a parsed `Value` rounds long numbers).
        let texts = std::str::from_utf8(&bytes)
            .ok()
            .and_then(jsonrpc::batch_texts)
            .filter(|t| t.len() == items.len())
            .map(|t| t.into_iter().map(str::to_string).collect::<Vec<_>>())
            .unwrap_or_else(|| items.iter().map(Value::to_string).collect());
        for (item, text) in items.into_iter().zip(texts) {
            if jsonrpc::cancelled_request_id(&item)
                .is_some_and(|id| self.sessions.is_guarded_in_flight(session, &id))
            {
                dropped = true;
                continue;
            }
            if let Some(refusal) = unreadable_call(&item, &text) {
                refused.push(refusal);
                dropped = true;
                continue;
            }
            let mut span = MessageSpan::start(&self, &context, &item);
            let call = jsonrpc::as_request(&item).filter(|r| r.method == "tools/call");
            match call.and_then(|_| read_call(&self, &context, &item, &text, &mut span)) {
                Some(call) => calls.push((text, call)),
                None => {
                    rest.push(item);
                    rest_texts.push(text);
                    rest_spans.extend(span);
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
                return Reply::Accepted;
            }
            let bytes = if dropped { rest_bytes } else { bytes };
            let parent = rest_spans.first().map(MessageSpan::parent);
            let reply = self.forward(bytes, &context, None, edits, parent).await;
            return message_span::finish(rest_spans, reply);
        }
        let expects_answer = rest.iter().any(|m| jsonrpc::as_request(m).is_some());
        let forwarded = async {
            if rest.is_empty() {
                return Vec::new();
            }
            let parent = rest_spans.first().map(MessageSpan::parent);
            let reply = self
                .forward(rest_bytes, &context, None, edits, parent)
                .await;
            let reply = message_span::finish(rest_spans, reply);
            let ids: Vec<Value> = rest
                .iter()
                .filter_map(|m| jsonrpc::as_request(m).map(|r| r.id.clone()))
                .collect();
            responses_of(reply, &ids).await
        };
        let guarded = futures::future::join_all(calls.into_iter().map(|(text, call)| {
            let me = self.clone();
            let context = context.clone();
            async move {
                let id = call.id.clone();
                let reply = me.guard(Bytes::from(text), call, &context).await;
                responses_of(reply, std::slice::from_ref(&id)).await
            }
        }));
        let (mut answers, guarded) = tokio::join!(forwarded, guarded);
        answers.extend(guarded.into_iter().flatten());
        answers.extend(refused);
        if answers.is_empty() && !expects_answer {
            return Reply::Accepted;
        }
        Reply::Message(Value::Array(answers), None)
    }
}

/// Reads a whole reply and returns the responses to `ids` in it; an id without one gets a
/// JSON-RPC error that says why (for answers joined into a batch).
async fn responses_of<H>(reply: Reply<H>, ids: &[Value]) -> Vec<Value> {
    let (why, messages) = match reply {
        Reply::Server {
            answer, mut edit, ..
        } => {
            let why = answer
                .refused
                .as_ref()
                .map_or_else(|| "HTTP 200".to_string(), |r| r.reason.clone());
            let bytes = read_whole(answer.body).await.unwrap_or_default();
            let mut messages = messages_in(answer.framing, &bytes);
            if let Some(edit) = edit.as_mut() {
                for m in &mut messages {
                    edit(m);
                }
            }
            let text = String::from_utf8_lossy(&bytes).into_owned();
            (format!("{why}): {text}"), messages)
        }
        Reply::Message(Value::Array(items), _) => (String::new(), items),
        Reply::Message(m, _) | Reply::Refused(m) => (String::new(), vec![m]),
        Reply::Failed { code, detail, .. } => (
            format!(
                "HTTP {}): {detail} ({})",
                code.status().as_u16(),
                code.as_str()
            ),
            Vec::new(),
        ),
        Reply::Accepted | Reply::Cancelled => ("HTTP 202): ".to_string(), Vec::new()),
    };
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
                    jsonrpc::error_message(id, code::INTERNAL_ERROR, &format!("no response ({why}"))
                })
        })
        .collect()
}
