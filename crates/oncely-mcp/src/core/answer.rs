//! What the caller of a guarded call gets: each [`Execution`] of the engine mapped to an MCP
//! answer (the fresh answer as it streams, a replay of the stored result under the repeat's
//! own id, an `isError` result for a call still in flight, too large to keep or whose
//! outcome is unknown, a task for a call that outlived `wait`), and what each answer
//! records (the call's span, its request line and metrics).

use std::time::Duration;

use oncely_core::{Record, State};
use oncely_engine::{Execution, UpstreamFailure};
use oncely_http::problem::ProblemCode;
use oncely_http::request_log::{Counted, RequestLine};
use oncely_tower::trace::{attr, Span};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::call::Call;
use super::guarded::{Executed, ServerHead};
use super::message_span::{self, MessageSpan};
use super::results::{error_result, for_revision, outcome_unknown_result, task, too_large_result};
use super::{Core, Mark, Reply, Server, ServerAnswer};
use crate::jsonrpc::code;
use crate::jsonrpc::{self, REPLAY_META_KEY};
use crate::tasks::{self, TaskStatus};

impl<S: Server> Core<S> {
    /// Maps what the engine did to an MCP answer.
    pub(super) fn answer(
        &self,
        execution: Executed<S::Head>,
        call: &Call,
        started: Instant,
    ) -> Reply<S::Head> {
        let inner = self;
        match execution {
            Execution::Fresh(fresh) => {
                let ServerHead { head, framing } = fresh.head;
                let reply = Reply::Server {
                    answer: ServerAnswer {
                        head,
                        framing,
                        body: Box::pin(fresh.body),
                        refused: None,
                        ledger: Default::default(),
                    },
                    edit: None,
                    mark: Some(Mark::of(Some("fresh"), &fresh.record)),
                    cancel: None,
                };
                if let Some(values) = call.made_key {
                    inner.made_keys.first(&fresh.record.id, values);
                }
                observe_fresh(inner, call, &fresh.record, fresh.status, started, reply)
            }
            Execution::Replayed(record) => {
                made_up(inner, call, &record);
                replay(inner, &record, "replayed", call, started)
            }
            Execution::Joined(record) => {
                made_up(inner, call, &record);
                replay(inner, &record, "joined", call, started)
            }
            Execution::InFlight {
                record,
                retry_after,
            } => in_flight(inner, &record, retry_after, call, started),
            Execution::TooLarge(record) => {
                observe(inner, call, &record, "too_large", None, started);
                respond(call, too_large_result(&call.tool, &record), &record)
            }
            Execution::OutcomeUnknown(record) => {
                observe(inner, call, &record, "outcome_unknown", None, started);
                outcome_unknown(call, &record, false)
            }
            Execution::StoreUnavailable(why) => {
                tracing::error!(route = %call.guarded.route, error = %why,
                "ledger unavailable: tools/call not forwarded");
                if let Some(mut span) = call.span.lock().expect("call span lock").take() {
                    span.set(attr::ROUTE, call.guarded.route.as_str());
                    span.set(attr::DECISION, "store_unavailable");
                    span.set(attr::ERROR_TYPE, "store_unavailable");
                    span.fail("the ledger cannot be reached");
                    span.end();
                }
                Reply::failed(
                    Some(&call.id),
                    ProblemCode::StoreUnavailable,
                    "the ledger cannot be reached; the tool call was not forwarded",
                )
            }
            Execution::UpstreamFailed { record, failure } => {
                if record.state == State::OutcomeUnknown {
                    tracing::warn!(route = %call.guarded.route, record = %record.id, failure = ?failure,
                    "action failed ambiguously: outcome_unknown");
                    observe(inner, call, &record, "outcome_unknown", None, started);
                    return outcome_unknown(call, &record, true);
                }
                let (code, detail) = match failure {
                    UpstreamFailure::Unreachable(e) => {
                        tracing::warn!(route = %call.guarded.route, error = %e, "upstream unreachable");
                        (
                            ProblemCode::UpstreamUnreachable,
                            "the MCP server could not be reached",
                        )
                    }
                    UpstreamFailure::Lost(e) => {
                        tracing::warn!(route = %call.guarded.route, error = %e, "upstream failed");
                        (
                            ProblemCode::UpstreamFailed,
                            "the MCP server's answer broke off",
                        )
                    }
                    UpstreamFailure::Timeout => (
                        ProblemCode::UpstreamTimeout,
                        "the MCP server did not answer within timeout",
                    ),
                    UpstreamFailure::Busy => (
                        ProblemCode::UpstreamBusy,
                        "the MCP server's every slot stayed taken; the call was not sent",
                    ),
                };
                // An error of the gateway's own: the span and the line say its code.
                observe(inner, call, &record, code.as_str(), None, started);
                Reply::failed(Some(&call.id), code, detail)
            }
            // The key is the fingerprint, so a key is never reused with another one; and
            // anything a later engine adds is answered as an internal error, not forwarded.
            other => {
                tracing::error!(route = %call.guarded.route, execution = ?other, "unexpected execution");
                Reply::Message(
                    jsonrpc::error_message(
                        &call.id,
                        code::INTERNAL_ERROR,
                        "oncely could not guard this call",
                    ),
                    None,
                )
            }
        }
    }

    /// The `CreateTaskResult` for a guarded call still running after `wait`: the task of
    /// the record's current attempt.
    pub(super) fn task_created(
        &self,
        call: &Call,
        record: &Record,
        started: Instant,
    ) -> Reply<S::Head> {
        let inner = self;
        observe(inner, call, record, "in_flight", None, started);
        let task = task(
            &inner.config,
            record,
            record.attempt,
            &call.tool,
            &TaskStatus::Working,
        );
        Reply::Message(
            jsonrpc::result_message(&call.id, tasks::create_task_result(task)),
            Some(Mark::of(Some("in_flight"), record)),
        )
    }

    /// Records a fresh answer to `call` (see [`observe_fresh`]).
    pub(super) fn observe_fresh(
        &self,
        call: &Call,
        record: &Record,
        upstream_status: u16,
        started: Instant,
        reply: Reply<S::Head>,
    ) -> Reply<S::Head> {
        observe_fresh(self, call, record, upstream_status, started, reply)
    }
}

fn replay<S: Server>(
    inner: &Core<S>,
    record: &Record,
    kind: &'static str,
    call: &Call,
    started: Instant,
) -> Reply<S::Head> {
    if let Some(span) = call.span.lock().expect("call span lock").as_mut() {
        span.link_to(record.trace.as_deref());
    }
    let stored = record
        .response
        .as_ref()
        .and_then(|r| r.body.as_deref())
        .and_then(|b| serde_json::from_slice::<Value>(b).ok());
    let Some(mut result) = stored else {
        tracing::error!(record = %record.id, "a stored tool result is not JSON");
        return Reply::Message(
            jsonrpc::error_message(
                &call.id,
                code::INTERNAL_ERROR,
                "the stored tool result is unreadable",
            ),
            None,
        );
    };
    if result.get("resultType").and_then(Value::as_str) == Some("task") && !call.tasks {
        // The original became a task on the server; this client did not declare the
        // extension, so it must not get a task (and the tool does not run again).
        let text = format!(
            "The earlier call of `{tool}` with these arguments is a task on the server (task \
             {task}), which this client cannot follow: it did not declare the \
             io.modelcontextprotocol/tasks extension. The tool will not run again for these \
             arguments until the replay window ends; call it from a client that supports \
             tasks to follow it.",
            tool = call.tool,
            task = result.get("taskId").and_then(Value::as_str).unwrap_or("?"),
        );
        observe(inner, call, record, kind, None, started);
        return tool_error(
            call,
            &text,
            json!({"status": kind, "original_at": record.created_at.to_rfc3339(), "record": record.id.as_str()}),
            record,
        );
    }
    jsonrpc::set_meta(
        &mut result,
        REPLAY_META_KEY,
        json!({"status": kind, "original_at": record.created_at.to_rfc3339(), "record": record.id.as_str()}),
    );
    for_revision(&mut result, call.modern);
    observe(inner, call, record, kind, None, started);
    let mark = Mark {
        replayed: true,
        ..Mark::of(Some(kind), record)
    };
    Reply::Message(jsonrpc::result_message(&call.id, result), Some(mark))
}

/// The `isError` result for a call whose record awaits reconciliation: `first` when
/// this caller's own call just failed ambiguously, else a duplicate of such a call.
fn outcome_unknown<H>(call: &Call, record: &Record, first: bool) -> Reply<H> {
    respond(
        call,
        outcome_unknown_result(&call.tool, record, first),
        record,
    )
}

fn in_flight<S: Server>(
    inner: &Core<S>,
    record: &Record,
    retry_after: Duration,
    call: &Call,
    started: Instant,
) -> Reply<S::Head> {
    let after = retry_after.as_secs().max(1);
    let text = format!(
        "The original call of `{tool}` with these arguments is still running (it started at \
         {at}). It will not run twice. Call `{tool}` again with the same arguments after \
         {after} second{s} to receive its result.",
        tool = call.tool,
        at = record.created_at.to_rfc3339(),
        s = if after == 1 { "" } else { "s" },
    );
    observe(inner, call, record, "in_flight", None, started);
    let mut reply = tool_error(
        call,
        &text,
        json!({"status": "in_flight", "original_at": record.created_at.to_rfc3339(), "retry_after": after}),
        record,
    );
    if let Reply::Message(_, Some(mark)) = &mut reply {
        mark.retry_after = Some(after);
    }
    reply
}

/// Counts a repeat whose key arguments carry values the model made up for it (once each:
/// `made_keys`), and marks its span.
fn made_up<S: Server>(inner: &Core<S>, call: &Call, record: &Record) {
    let Some(values) = call.made_key else {
        return;
    };
    if !inner.made_keys.made_up(&record.id, values) {
        return;
    }
    metrics::counter!("oncely_key_churn_total", "route" => call.guarded.route.clone(), "tool" => call.tool.clone())
        .increment(1);
    if let Some(span) = call.span.lock().expect("call span lock").as_mut() {
        span.set(attr::KEY_CHURN, true);
    }
}

/// Records what became of `call`: ends its span, and writes its request line and metrics.
fn observe<S: Server>(
    inner: &Core<S>,
    call: &Call,
    record: &Record,
    status: &'static str,
    upstream_status: Option<u16>,
    started: Instant,
) {
    if let Some(mut span) = described(call, record, status, upstream_status) {
        // A result with isError (the tool's own, or one oncely writes) is a tool_error.
        let is_error = |b: &[u8]| {
            serde_json::from_slice::<Value>(b)
                .ok()
                .and_then(|v| v.get("isError")?.as_bool())
                == Some(true)
        };
        let stored = record.response.as_ref().and_then(|r| r.body.as_deref());
        match status {
            "fresh" | "replayed" | "joined" if !stored.is_some_and(is_error) => {}
            "fresh" | "replayed" | "joined" | "in_flight" | "outcome_unknown" | "too_large" => {
                span.set(attr::ERROR_TYPE, "tool_error");
                span.fail("tool_error");
            }
            // An error of the gateway's own is its problem code.
            own => {
                span.set(attr::ERROR_TYPE, own);
                span.fail(own);
            }
        }
        span.end();
    }
    line(inner, call, record, status, upstream_status, started);
}

/// Records a fresh answer passed on from the server: its line now, and its span once the
/// call's response has passed (`tool_error` for a result with `isError`, the code of a
/// JSON-RPC error), read on the way as every message's.
fn observe_fresh<S: Server>(
    inner: &Core<S>,
    call: &Call,
    record: &Record,
    upstream_status: u16,
    started: Instant,
    reply: Reply<S::Head>,
) -> Reply<S::Head> {
    let span = described(call, record, "fresh", Some(upstream_status));
    line(inner, call, record, "fresh", Some(upstream_status), started);
    let spans = span
        .map(|span| MessageSpan::of(span, call.id.clone()))
        .into_iter()
        .collect();
    message_span::finish(spans, reply)
}

/// The call's span (traces on, not ended yet) with what became of it.
fn described(
    call: &Call,
    record: &Record,
    status: &'static str,
    upstream_status: Option<u16>,
) -> Option<Span> {
    let mut span = call.span.lock().expect("call span lock").take()?;
    span.set(attr::ROUTE, call.guarded.route.as_str());
    span.set(attr::DECISION, status);
    span.set(attr::RECORD, record.id.as_str());
    span.set(attr::ATTEMPT, i64::from(record.attempt));
    span.set(attr::PRINCIPAL, call.guarded.principal.as_str());
    if let Some(upstream) = upstream_status {
        span.set(attr::UPSTREAM_STATUS, i64::from(upstream));
    }
    if let Some(workflow) = &call.guarded.workflow_id {
        span.set(attr::WORKFLOW_ID, workflow.as_str());
    }
    Some(span)
}

/// The call's request line, and the metrics it counts.
fn line<S: Server>(
    inner: &Core<S>,
    call: &Call,
    record: &Record,
    status: &'static str,
    upstream_status: Option<u16>,
    started: Instant,
) {
    // Labels are bounded: a tool no listing or config named counts as `other`.
    let tool = inner.catalog.metric_label(&inner.config.tools, &call.tool);
    RequestLine {
        record: Some(record.id.as_str()),
        route: call.guarded.route.as_str(),
        principal: Some(call.guarded.principal.as_str()),
        status,
        attempt: Some(record.attempt),
        workflow_id: record.workflow_id.as_deref(),
        upstream_status,
        provider_request_id: None,
        duration_ms: started.elapsed().as_millis() as u64,
        tool: Some(call.tool.as_str()),
    }
    .emit_counted_as(
        "mcp tools/call",
        Counted {
            route: &inner.config.route_of(tool),
            tool,
        },
    );
}

/// A tool result with `isError: true` and one text, marked with `_meta`, as the call's
/// protocol revision writes it.
fn tool_error<H>(call: &Call, text: &str, meta: Value, record: &Record) -> Reply<H> {
    respond(call, error_result(text, meta), record)
}

/// Answers `call` with `result`, as the call's protocol revision writes it.
fn respond<H>(call: &Call, mut result: Value, record: &Record) -> Reply<H> {
    for_revision(&mut result, call.modern);
    Reply::Message(
        jsonrpc::result_message(&call.id, result),
        Some(Mark::of(None, record)),
    )
}
