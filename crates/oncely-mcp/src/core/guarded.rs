//! Running a guarded call through the gateway's one engine
//! ([`oncely_tower::Guard::execute`]): the caller's wait (cancelled with its client's
//! request, or answered with a task after `wait`), the owner's upstream call with the
//! derived downstream key, and the [`Classifier`] that decides what the ledger keeps of
//! its answer.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use oncely_core::{DownstreamKey, Record, State, StoredResponse};
use oncely_engine::{
    Classified, Classifier, Execution, FreshAnswer, UpstreamAnswer, UpstreamFuture,
};
use oncely_http::problem::ProblemCode;
use oncely_tower::trace::Span;
use serde_json::Value;
use tokio::time::Instant;

use super::call::Call;
use super::server::{messages_in, read_whole};
use super::server::{BodyStream, Framing, Outgoing, ServerAnswer};
use super::server_task;
use super::sessions::Tracked;
use super::{Context, Core, Mark, Reply, Server};
use crate::jsonrpc::code;
use crate::jsonrpc::{self, Outcome};
use crate::tasks::{self, History};

/// Why a call answered `input_required` is released.
const INPUT_REQUIRED: &str = "the server asked for input (input_required): not stored; the \
    continuation that answers it is a call of its own";

/// What the engine makes of a guarded call here.
pub(super) type Executed<H> = Execution<FreshAnswer<ServerHead<H>>>;

/// The server's answer as the engine hands it back to the caller: the transport's head
/// and how the body holds its messages.
pub(super) struct ServerHead<H> {
    pub(super) head: H,
    pub(super) framing: Framing,
}

impl<S: Server> Core<S> {
    /// Runs a guarded call through the engine and answers in MCP terms. `bytes` is the
    /// message the call came in (the owner's upstream call is sent as it, with the
    /// downstream key); `context` what its transport knows of it.
    pub(super) async fn guard(
        self: Arc<Self>,
        bytes: Bytes,
        call: Call,
        context: &Context<S::Origin>,
    ) -> Reply<S::Head> {
        let started = Instant::now();
        let session = &context.session;
        // While this caller waits or runs, its cancellation is dropped; the owner's call
        // keeps its own entry until the owner task has recorded it.
        let _tracked = self.sessions.track(session, &call.id, false);
        let owner_tracked = self.sessions.track(session, &call.id, true);
        let parent = call
            .span
            .lock()
            .expect("call span lock")
            .as_ref()
            .map(Span::as_parent);
        let run = self.owner_call(bytes, context.origin.clone(), &call, parent, owner_tracked);
        if call.tasks {
            return self.guard_as_task(call, run, started).await;
        }
        let Some(cancel) = self.sessions.cancellation(session, &call.id) else {
            let execution = self.guard.engine().execute(call.guarded.clone(), run).await;
            return self.answer(execution, &call, started);
        };
        // The client may cancel its request: then it gets no answer (the revision's rule),
        // and the call, on a task of its own, runs on for the retry.
        let me = self.clone();
        let guarded = call.guarded.clone();
        let mut execution =
            tokio::spawn(async move { me.guard.engine().execute(guarded, run).await });
        let execution = tokio::select! {
            done = &mut execution => done,
            () = cancel => {
                tracing::info!(route = %call.guarded.route, request_id = %jsonrpc::id_text(&call.id),
                    "the client cancelled its request: not answered; the call runs on");
                return Reply::Cancelled;
            }
        };
        let reply = match execution {
            Ok(execution) => self.answer(execution, &call, started),
            Err(e) => {
                tracing::error!(route = %call.guarded.route, error = %e, "guarded call task failed");
                return could_not_guard(&call);
            }
        };
        match (reply, self.sessions.cancellation(session, &call.id)) {
            (
                Reply::Server {
                    answer, edit, mark, ..
                },
                Some(cancel),
            ) => Reply::Server {
                answer,
                edit,
                mark,
                cancel: Some(cancel),
            },
            (reply, _) => reply,
        }
    }

    /// A guarded call of a client that declared the tasks extension: answered as usual
    /// when it ends within `wait`, else with a task whose id is the record's (the owner
    /// task runs on and records the call; duplicates get the same task).
    async fn guard_as_task<F>(
        self: Arc<Self>,
        call: Call,
        run: F,
        started: Instant,
    ) -> Reply<S::Head>
    where
        F: FnOnce(DownstreamKey, &Record) -> UpstreamFuture<ServerHead<S::Head>> + Send + 'static,
    {
        let deadline = Instant::now() + call.guarded.wait;
        let me = self.clone();
        let guarded = call.guarded.clone();
        // On a task of its own, so that giving up on it after `wait` abandons nothing.
        let mut execution =
            tokio::spawn(async move { me.guard.engine().execute(guarded, run).await });
        let execution = match tokio::time::timeout_at(deadline, &mut execution).await {
            Ok(done) => done,
            Err(_) => {
                let store = self.guard.store();
                match store.lookup(&call.guarded.scope, &call.guarded.key).await {
                    Ok(Some(record)) if record.state == State::Processing => {
                        return self.task_created(&call, &record, started);
                    }
                    _ => execution.await,
                }
            }
        };
        let execution = match execution {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(route = %call.guarded.route, error = %e, "guarded call task failed");
                return could_not_guard(&call);
            }
        };
        match execution {
            Execution::Fresh(fresh) => {
                // The whole answer within `wait`, or a task (dropping the body abandons
                // nothing: the owner task reads and records it all the same).
                let body: BodyStream = Box::pin(fresh.body);
                match tokio::time::timeout_at(deadline, read_whole(body)).await {
                    Ok(Ok(bytes)) => {
                        let ServerHead { head, framing } = fresh.head;
                        let reply = Reply::Server {
                            answer: ServerAnswer::json(head, framing, bytes.into()),
                            edit: None,
                            mark: Some(Mark::of(Some("fresh"), &fresh.record)),
                            cancel: None,
                        };
                        self.observe_fresh(&call, &fresh.record, fresh.status, started, reply)
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(route = %call.guarded.route, error = %e, "upstream failed");
                        Reply::failed(
                            Some(&call.id),
                            ProblemCode::UpstreamFailed,
                            "the MCP server's answer broke off",
                        )
                    }
                    Err(_) => self.task_created(&call, &fresh.record, started),
                }
            }
            Execution::InFlight { record, .. } => self.task_created(&call, &record, started),
            other => self.answer(other, &call, started),
        }
    }

    /// The owner's upstream call of a guarded `tools/call`, as the engine runs it once it
    /// owns the claimed record: the call sent with the downstream key, its answer
    /// classified for the record (with the attempt and what earlier attempts left in it).
    /// A tool the server runs only as a task is called with `task`; a call the server
    /// answers with a task is followed to its end (`server_task`), and its answer is the
    /// task's result.
    fn owner_call(
        self: &Arc<Self>,
        bytes: Bytes,
        origin: S::Origin,
        call: &Call,
        parent: Option<oncely_tower::trace::SpanParent>,
        owner_tracked: Tracked,
    ) -> impl FnOnce(DownstreamKey, &Record) -> UpstreamFuture<ServerHead<S::Head>> + Send + 'static
    {
        let me = self.clone();
        let (id, tool) = (call.id.clone(), call.tool.clone());
        let replaced: Vec<String> = call
            .key_arguments
            .iter()
            .filter(|k| k.replaced)
            .map(|k| k.pointer.clone())
            .collect();
        // 2025-11-25 runs a tool that requires a task only as one; 2026-07-28's server
        // may answer a call that declared the extension (as its client's did) with one.
        let asks_task = !call.modern && self.catalog.needs_task(&tool);
        let may_be_task = asks_task || call.tasks;
        let meta = call.protocol_meta.clone();
        move |downstream: DownstreamKey, claimed: &Record| {
            // The derived downstream key reaches the server, so that it can deduplicate too;
            // and the client span's trace context, in `_meta` as in the HTTP header.
            let (parent, trace) = match parent {
                Some(p) => {
                    let (p, tp) = p.with_next_child();
                    let state = p.trace_state().map(str::to_string);
                    (Some(p), Some((tp, state)))
                }
                None => (None, None),
            };
            let mut bytes = forwarded_call(&bytes, downstream.as_str(), trace.as_ref());
            // The model's key arguments give way to the record's key, the same on every
            // attempt of the call (in the UUID layout).
            if !replaced.is_empty() {
                let key = Value::String(downstream.as_uuid()).to_string();
                for pointer in &replaced {
                    let text = std::str::from_utf8(&bytes).ok();
                    if let Some(set) = text.and_then(|t| jsonrpc::with_argument(t, pointer, &key)) {
                        bytes = set.into();
                    }
                }
            }
            if asks_task {
                let text = std::str::from_utf8(&bytes).ok();
                let asked = text.and_then(|t| {
                    jsonrpc::with_param(t, jsonrpc::TASK_PARAM, server_task::TASK_PARAM_VALUE)
                });
                if let Some(asked) = asked {
                    bytes = asked.into();
                }
            }
            let (attempt, history) = (claimed.attempt, History::of(claimed));
            let sent = me.server.send(Outgoing {
                bytes,
                origin: &origin,
                owner: true,
                span: parent,
                own: false,
            });
            Box::pin(async move {
                let answer = sent.await?;
                let ServerAnswer {
                    mut head,
                    framing,
                    mut body,
                    refused,
                    mut ledger,
                } = answer;
                if may_be_task && refused.is_none() {
                    // Read whole to see whether it is a task (a break-off: what came).
                    let whole = read_whole(break_as_end(body)).await.unwrap_or_default();
                    let answer = me.clone().answer_of_task(&id, framing, whole, origin, meta);
                    let answer = answer.await;
                    S::body_replaced(&mut head);
                    ledger.length = None;
                    body = Box::pin(futures::stream::once(async move { Ok(answer) }));
                }
                // A message answered is 200 to the engine; a refusal its transport's code.
                let status = refused.as_ref().map_or(200, |r| r.status);
                let learn = move || me.catalog.learn_needs_task(&tool);
                let classify =
                    classifier(id, framing, refused, attempt, history, owner_tracked, learn);
                Ok(UpstreamAnswer {
                    status,
                    head: ServerHead { head, framing },
                    // A break-off after the answer began is a stream end: never a release.
                    body: break_as_end(body),
                    units: None,
                    stored_headers: ledger.stored_headers,
                    replay_until: ledger.replay_until,
                    replay_seconds: ledger.replay_seconds,
                    provider_request_id: ledger.provider_request_id,
                    classify: Some(classify),
                    length: ledger.length,
                })
            }) as UpstreamFuture<ServerHead<S::Head>>
        }
    }
}

/// The JSON-RPC error of a call oncely could not guard (its task failed).
fn could_not_guard<H>(call: &Call) -> Reply<H> {
    Reply::Message(
        jsonrpc::error_message(
            &call.id,
            code::INTERNAL_ERROR,
            "oncely could not guard this call",
        ),
        None,
    )
}

/// An answer whose break-off reads as its end: the classifier then finds no response in
/// it and marks the call `outcome_unknown` (it was sent and may have run), instead of the
/// engine releasing it as a lost exchange.
fn break_as_end(body: BodyStream) -> BodyStream {
    Box::pin(body.scan((), |_, chunk| {
        futures::future::ready(match chunk {
            Ok(bytes) => Some(Ok(bytes)),
            Err(e) => {
                tracing::warn!(error = %e, "the MCP server's answer broke off");
                None
            }
        })
    }))
}

/// What the ledger keeps of a guarded call's answer, decided once the owner task has read
/// it whole: the `result` for `id` (stored as a JSON body), or nothing (released) for a
/// refusal by the server's transport, a JSON-RPC error, an `input_required` result, or no
/// response at all. `attempt` is the claimed attempt and `history` the failures of
/// earlier ones, carried on in the record (see [`crate::tasks`]). `tracked` keeps the
/// call's cancellations dropped until the owner task is done with it. `needs_task` is
/// told when the server refused the call because the tool runs only as a task.
fn classifier(
    id: Value,
    framing: Framing,
    refused: Option<super::server::Refusal>,
    attempt: u32,
    history: History,
    tracked: Tracked,
    needs_task: impl FnOnce() + Send + 'static,
) -> Classifier {
    Box::new(move |body| {
        let _tracked = tracked;
        let failed = |reason: String, error: Value| {
            Classified::Release(history.clone().with(attempt, error).reason(&reason))
        };
        if let Some(refused) = refused {
            let reason = format!("no tool result ({})", refused.reason);
            return failed(reason.clone(), tasks::internal_error(&reason));
        }
        let outcome = messages_in(framing, body)
            .iter()
            .find_map(|m| jsonrpc::response_to(m, &id));
        match outcome {
            // The server asks for input (2026-07-28): nothing happened yet. The continuation
            // that answers it is a call of its own, and the one that executes.
            Some(Outcome::Result(result))
                if result.get("resultType").and_then(Value::as_str) == Some("input_required") =>
            {
                Classified::Release(history.reason(INPUT_REQUIRED))
            }
            // A protocol error the server's SDK wrapped as a tool result: the tool did
            // not run (it needs a task, its arguments did not validate), so the result is
            // not the call's and is not stored.
            Some(Outcome::Result(result)) if protocol_error_text(&result).is_some() => {
                let text = protocol_error_text(&result).unwrap_or_default().to_string();
                if says_task_required(&text) {
                    needs_task();
                }
                let error = serde_json::json!({"code": code::INTERNAL_ERROR, "message": text});
                failed(
                    format!("a protocol error as a tool result (not stored): {text}"),
                    error,
                )
            }
            Some(Outcome::Result(result)) => {
                let mut headers = vec![("content-type".into(), "application/json".into())];
                if !history.0.is_empty() {
                    headers.push((tasks::HISTORY_HEADER.into(), history.to_text()));
                }
                Classified::Store(StoredResponse {
                    status: 200,
                    headers,
                    body: Some(serde_json::to_vec(&result).unwrap_or_default().into()),
                })
            }
            Some(Outcome::Error(e)) => {
                let text = format!(
                    "MCP error {}: {}",
                    e.get("code").unwrap_or(&Value::Null),
                    e.get("message").and_then(Value::as_str).unwrap_or_default()
                );
                if says_task_required(&text) {
                    needs_task();
                }
                failed(format!("JSON-RPC error (not stored): {e}"), e)
            }
            // The call was sent and the answer ended without its response: it may have run
            // (a server that ended its session aborts it mid-way). Never released.
            None => {
                Classified::Unknown(history.reason(
                    "the answer ended without the call's JSON-RPC response: it may have run",
                ))
            }
        }
    })
}

/// The text of a tool result that is a JSON-RPC protocol error the server's SDK wrapped
/// as an `isError` result instead of answering it as an error: one text, `MCP error
/// -326NN: ...` (-32600 to -32603: invalid request, method not found, invalid params,
/// internal error), as the official TypeScript SDK's `McpServer` writes an `McpError`
/// thrown before the tool ran (a tool that requires a task called without one: -32601;
/// arguments that fail the input schema: -32602).
fn protocol_error_text(result: &Value) -> Option<&str> {
    if result.get("isError") != Some(&Value::Bool(true)) {
        return None;
    }
    let content = result.get("content")?.as_array()?;
    let [only] = content.as_slice() else {
        return None;
    };
    let text = only.get("text")?.as_str()?;
    let code = text.strip_prefix("MCP error -3260")?;
    matches!(code.as_bytes(), [b'0'..=b'3', b':', ..]).then_some(text)
}

/// Whether a protocol error says the tool runs only as a task (the TypeScript SDK:
/// "MCP error -32601: Tool X requires task augmentation (taskSupport: 'required')").
fn says_task_required(text: &str) -> bool {
    text.starts_with("MCP error -32601:") && text.contains("task")
}

/// The guarded call's request body as forwarded ([`jsonrpc::forwarded_call`]: the
/// downstream key in `_meta`, no `task`); the body as it came when it is not a JSON-RPC
/// request with object params. The arguments reach the server as the caller wrote them.
fn forwarded_call(
    body: &Bytes,
    key: &str,
    trace: Option<&(oncely_tower::trace::TraceParent, Option<String>)>,
) -> Bytes {
    let header = trace.map(|(tp, _)| tp.to_header());
    let mut more = Vec::new();
    if let Some(tp) = header.as_ref().and_then(|h| h.to_str().ok()) {
        more.push((oncely_tower::trace::TRACEPARENT, tp));
    }
    if let Some(state) = trace.and_then(|(_, s)| s.as_deref()) {
        more.push((oncely_tower::trace::TRACESTATE, state));
    }
    std::str::from_utf8(body)
        .ok()
        .and_then(|text| jsonrpc::forwarded_call_with(text, key, &more))
        .map(Bytes::from)
        .unwrap_or_else(|| body.clone())
}

#[cfg(test)]
mod tests {
    use super::protocol_error_text;
    use serde_json::json;

    #[test]
    fn a_protocol_error_wrapped_as_a_tool_result_is_recognised() {
        let wrapped =
            |text: &str| json!({"content": [{"type": "text", "text": text}], "isError": true});
        let needs_task = "MCP error -32601: Tool simulate-research-query requires task augmentation (taskSupport: 'required')";
        assert_eq!(protocol_error_text(&wrapped(needs_task)), Some(needs_task));
        assert!(
            protocol_error_text(&wrapped("MCP error -32602: Input validation error")).is_some()
        );
        // The tool's own failure, or an error of the tool's own code, is a result.
        assert!(protocol_error_text(&wrapped("the card was declined")).is_none());
        assert!(protocol_error_text(&wrapped("MCP error -32001: Request timed out")).is_none());
        let mut ok = wrapped(needs_task);
        ok["isError"] = json!(false);
        assert!(protocol_error_text(&ok).is_none());
        let mut two = wrapped(needs_task);
        two["content"] =
            json!([{"type": "text", "text": needs_task}, {"type": "text", "text": "x"}]);
        assert!(protocol_error_text(&two).is_none());
    }
}
