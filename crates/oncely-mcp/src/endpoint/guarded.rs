//! Running a guarded call through the gateway's one engine
//! ([`oncely_tower::Guard::execute`]): the caller's wait (cancelled with its client's
//! request, or answered with a task after `wait`), the owner's upstream call with the
//! derived downstream key, and the [`Classifier`] that decides what the ledger keeps of
//! its answer.

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use oncely_core::{DownstreamKey, Record, State, StoredResponse};
use oncely_http::problem::ProblemCode;
use oncely_tower::trace::Span;
use oncely_tower::{Classified, Classifier, Execution, OwnerSend, UpstreamCall, UpstreamResponse};
use serde_json::Value;
use tokio::time::Instant;

use super::answer::{answer, observe, task_created};
use super::call::Call;
use super::response::{cancelled_answer, json_response, mark, messages_in, problem};
use super::sessions::Tracked;
use super::state::{send, Inner};
use crate::body::{full, BreakAsEnd, McpBody, UntilCancelled};
use crate::jsonrpc::code;
use crate::jsonrpc::{self, Outcome};
use crate::tasks::{self, History};
use crate::BoxError;

/// Why a call answered `input_required` is released.
const INPUT_REQUIRED: &str = "the server asked for input (input_required): not stored; the \
    continuation that answers it is a call of its own";

/// Runs a guarded call through the engine and answers in MCP terms. `parts` and `bytes`
/// are the request the call came in (the owner's upstream call is sent as it, with the
/// downstream key); `session` is the client session it was sent on.
pub(super) async fn guard(
    inner: Arc<Inner>,
    parts: &http::request::Parts,
    bytes: Bytes,
    call: Call,
    session: &Option<String>,
) -> Response<McpBody> {
    let started = Instant::now();
    // While this caller waits or runs, its cancellation is dropped; the owner's call
    // keeps its own entry until the owner task has recorded it.
    let _tracked = inner.sessions.track(session, &call.id, false);
    let owner_tracked = inner.sessions.track(session, &call.id, true);
    let me = inner.clone();
    let parts = parts.clone();
    let parent = call
        .span
        .lock()
        .expect("call span lock")
        .as_ref()
        .map(Span::as_parent);
    let run = owner_call(me, parts, bytes, call.id.clone(), parent, owner_tracked);
    if call.tasks {
        return guard_as_task(inner, call, run, started).await;
    }
    let Some(cancel) = inner.sessions.cancellation(session, &call.id) else {
        let execution = inner.guard.execute(call.guarded.clone(), run).await;
        return answer(&inner, execution, &call, started);
    };
    // The client may cancel its request: then it gets no answer (the revision's rule),
    // and the call, on a task of its own, runs on for the retry.
    let guard = inner.guard.clone();
    let guarded = call.guarded.clone();
    let mut execution = tokio::spawn(async move { guard.execute(guarded, run).await });
    let execution = tokio::select! {
        done = &mut execution => done,
        () = cancel => {
            tracing::info!(route = %call.guarded.route, request_id = %jsonrpc::id_text(&call.id),
                "the client cancelled its request: not answered; the call runs on");
            return cancelled_answer();
        }
    };
    let resp = match execution {
        Ok(execution) => answer(&inner, execution, &call, started),
        Err(e) => {
            tracing::error!(route = %call.guarded.route, error = %e, "guarded call task failed");
            return json_response(
                StatusCode::OK,
                &jsonrpc::error_message(
                    &call.id,
                    code::INTERNAL_ERROR,
                    "oncely could not guard this call",
                ),
            );
        }
    };
    match inner.sessions.cancellation(session, &call.id) {
        Some(cancel) => resp.map(|body| UntilCancelled::new(body, cancel).boxed()),
        None => resp,
    }
}

/// A guarded call of a client that declared the tasks extension: answered as usual
/// when it ends within `wait`, else with a task whose id is the record's (the owner task
/// runs on and records the call; duplicates get the same task).
async fn guard_as_task<F>(
    inner: Arc<Inner>,
    call: Call,
    run: F,
    started: Instant,
) -> Response<McpBody>
where
    F: FnOnce(DownstreamKey, &Record) -> UpstreamCall + Send + 'static,
{
    let deadline = Instant::now() + call.guarded.wait;
    let guard = inner.guard.clone();
    let guarded = call.guarded.clone();
    // On a task of its own, so that giving up on it after `wait` abandons nothing.
    let mut execution = tokio::spawn(async move { guard.execute(guarded, run).await });
    let execution = match tokio::time::timeout_at(deadline, &mut execution).await {
        Ok(done) => done,
        Err(_) => {
            let store = inner.guard.store();
            match store.lookup(&call.guarded.scope, &call.guarded.key).await {
                Ok(Some(record)) if record.state == State::Processing => {
                    return task_created(&inner, &call, &record, started);
                }
                _ => execution.await,
            }
        }
    };
    let execution = match execution {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(route = %call.guarded.route, error = %e, "guarded call task failed");
            return json_response(
                StatusCode::OK,
                &jsonrpc::error_message(
                    &call.id,
                    code::INTERNAL_ERROR,
                    "oncely could not guard this call",
                ),
            );
        }
    };
    match execution {
        Execution::Fresh(fresh) => {
            // The whole answer within `wait`, or a task (dropping the body abandons
            // nothing: the owner task reads and records it all the same).
            match tokio::time::timeout_at(deadline, fresh.body.collect()).await {
                Ok(Ok(collected)) => {
                    observe(
                        &inner,
                        &call,
                        &fresh.record,
                        "fresh",
                        Some(fresh.status.as_u16()),
                        started,
                    );
                    let mut resp = Response::new(full(collected.to_bytes()));
                    *resp.status_mut() = fresh.status;
                    *resp.headers_mut() = fresh.headers;
                    mark(resp.headers_mut(), "fresh", &fresh.record);
                    resp
                }
                Ok(Err(e)) => {
                    tracing::warn!(route = %call.guarded.route, error = %e, "upstream failed");
                    problem(
                        ProblemCode::UpstreamFailed,
                        "the MCP server's answer broke off",
                    )
                }
                Err(_) => task_created(&inner, &call, &fresh.record, started),
            }
        }
        Execution::InFlight { record, .. } => task_created(&inner, &call, &record, started),
        other => answer(&inner, other, &call, started),
    }
}

/// The owner's upstream call of a guarded `tools/call`, as the engine runs it once it owns
/// the claimed record: the call forwarded with the downstream key, its answer classified
/// for the record (with the attempt and what earlier attempts left in it).
fn owner_call(
    me: Arc<Inner>,
    parts: http::request::Parts,
    bytes: Bytes,
    id: Value,
    parent: Option<oncely_tower::trace::SpanParent>,
    owner_tracked: Tracked,
) -> impl FnOnce(DownstreamKey, &Record) -> UpstreamCall + Send + 'static {
    let upstream = me.upstream.clone();
    move |downstream: DownstreamKey, claimed: &Record| -> UpstreamCall {
        // The derived downstream key reaches the server, so that it can deduplicate too.
        let bytes = forwarded_call(&bytes, downstream.as_str());
        let (attempt, history) = (claimed.attempt, History::of(claimed));
        let mut req = me.upstream_request(&parts, bytes);
        // The owner holds the endpoint's slot and times the call: the upstream does neither.
        req.extensions_mut().insert(OwnerSend);
        let span = parent.map(|p| p.upstream_call(req.headers_mut(), &parts.method));
        async move {
            let resp = match send(upstream, req).await {
                Ok(resp) => {
                    if let Some(span) = span {
                        span.answered(resp.status().as_u16());
                    }
                    resp
                }
                Err(e) => {
                    let e = oncely_tower::upstream_error(e);
                    if let Some(span) = span {
                        span.failed(e.to_string());
                    }
                    return Err(e);
                }
            };
            let (parts, body) = resp.into_parts();
            // A break-off after the answer began is a stream end: never a release.
            let body = BreakAsEnd::new(body).map_err(BoxError::from).boxed();
            Ok(UpstreamResponse::new(parts.status, parts.headers, body)
                .with_classifier(classifier(id, attempt, history, owner_tracked)))
        }
        .boxed()
    }
}

/// What the ledger keeps of a guarded call's answer, decided once the owner task has read
/// it whole: the `result` for `id` (stored as a JSON body), or nothing (released) for an
/// HTTP error, a JSON-RPC error, an `input_required` result, or no response at all.
/// `attempt` is the claimed attempt and `history` the failures of earlier ones, carried on
/// in the record (see [`crate::tasks`]). `tracked` keeps the call's cancellations dropped
/// until the owner task is done with it.
fn classifier(id: Value, attempt: u32, history: History, tracked: Tracked) -> Classifier {
    Box::new(move |status, headers, body| {
        let _tracked = tracked;
        let failed = |reason: String, error: Value| {
            Classified::Release(history.clone().with(attempt, error).reason(&reason))
        };
        if !status.is_success() {
            let reason = format!("no tool result (HTTP {})", status.as_u16());
            return failed(reason.clone(), tasks::internal_error(&reason));
        }
        let outcome = messages_in(headers, body)
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
            Some(Outcome::Error(e)) => failed(format!("JSON-RPC error (not stored): {e}"), e),
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

/// The guarded call's request body as forwarded ([`jsonrpc::forwarded_call`]: the
/// downstream key in `_meta`, no `task`); the body as it came when it is not a JSON-RPC
/// request with object params. The arguments reach the server as the caller wrote them.
fn forwarded_call(body: &Bytes, key: &str) -> Bytes {
    std::str::from_utf8(body)
        .ok()
        .and_then(|text| jsonrpc::forwarded_call(text, key))
        .map(Bytes::from)
        .unwrap_or_else(|| body.clone())
}
