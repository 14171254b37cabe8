//! The MCP results and tasks the guard writes itself, as plain JSON values (no HTTP): the
//! `isError` results for a call too large to keep or whose outcome is unknown, the `Task`
//! of a record's attempt and what a `GetTaskResult` carries with it, each shaped for the
//! request's protocol revision.

use std::time::Duration;

use oncely_core::Record;
use serde_json::{json, Value};

use crate::config::McpConfig;
use crate::jsonrpc::{self, REPLAY_META_KEY};
use crate::tasks::{self, TaskStatus};

/// Makes a complete result oncely writes (or replays) valid for the revision: 2026-07-28
/// results carry `resultType` (`"complete"`); earlier revisions have no such member.
pub(super) fn for_revision(result: &mut Value, modern: bool) {
    let Some(obj) = result.as_object_mut() else {
        return;
    };
    if modern {
        obj.entry("resultType")
            .or_insert_with(|| Value::String("complete".into()));
    } else if obj.get("resultType").and_then(Value::as_str) == Some("complete") {
        obj.remove("resultType");
    }
}

/// A tool result with `isError: true` and one text, marked with `_meta`.
pub(super) fn error_result(text: &str, meta: Value) -> Value {
    let mut result = json!({"content": [{"type": "text", "text": text}], "isError": true});
    jsonrpc::set_meta(&mut result, REPLAY_META_KEY, meta);
    result
}

/// The result for a duplicate of a call whose result was too large to keep.
pub(super) fn too_large_result(tool: &str, record: &Record) -> Value {
    let text = format!(
        "The earlier call of `{tool}` with these arguments completed at {at}, but its result \
         was larger than the gateway keeps, so it cannot be shown again. The tool ran once and \
         will not run again for these arguments until its replay window ends ({until}). Do not \
         retry it; tell the user the result was too large to return twice.",
        at = record
            .completed_at
            .unwrap_or(record.created_at)
            .to_rfc3339(),
        until = record
            .expires_at
            .map(|t| t.to_rfc3339())
            .unwrap_or_default(),
    );
    error_result(
        &text,
        json!({"status": "result_too_large", "original_at": record.created_at.to_rfc3339()}),
    )
}

/// The result for a call whose record awaits reconciliation: `first` when this caller's
/// own call just failed ambiguously, else a duplicate of such a call.
pub(super) fn outcome_unknown_result(tool: &str, record: &Record, first: bool) -> Value {
    let what = if first {
        format!(
            "The call of `{tool}` was sent, but its answer was lost (the connection failed or \
             it timed out), so it is unknown whether it took effect."
        )
    } else {
        format!(
            "An earlier call of `{tool}` with these arguments (started at {at}) was sent, but \
             its answer was lost, so it is unknown whether it took effect.",
            at = record.created_at.to_rfc3339()
        )
    };
    let text = format!(
        "{what} It will not be run again automatically: do not retry it. Tell the user the \
         outcome must be checked; an operator reconciles it with `oncely ledger resolve {id} \
         --released` if it did not happen (then the same call runs again), or `oncely ledger \
         resolve {id} --completed --status 200 --body-file RESULT.json` if it did.",
        id = record.id
    );
    error_result(
        &text,
        json!({"status": "outcome_unknown", "original_at": record.created_at.to_rfc3339(), "record": record.id.as_str()}),
    )
}

/// How long a task of the endpoint `config` configures can be read: while its call may
/// run, then for the replay window.
fn task_ttl_ms(config: &McpConfig) -> u64 {
    (config.timeout + config.window).as_millis() as u64
}

/// How often a client is asked to poll a task.
fn task_poll_ms(config: &McpConfig) -> u64 {
    (config.wait / 4)
        .clamp(Duration::from_millis(250), Duration::from_secs(5))
        .as_millis() as u64
}

/// The `Task` of attempt `attempt` of `record`, in `status`, on the endpoint `config`
/// configures. A terminal task's members depend only on how it ended, so that it never
/// changes.
pub(super) fn task(
    config: &McpConfig,
    record: &Record,
    attempt: u32,
    tool: &str,
    status: &TaskStatus,
) -> Value {
    let started = record.created_at.to_rfc3339();
    let (name, message, updated) = match status {
        TaskStatus::Working => (
            "working",
            format!(
                "The call of `{tool}` is running (started at {started}). oncely runs it once \
                 for every caller with these arguments: poll tasks/get for its result. \
                 tasks/cancel never cancels the shared execution."
            ),
            record.updated_at.to_rfc3339(),
        ),
        TaskStatus::Unknown => (
            "working",
            format!(
                "The call of `{tool}` was sent, but its answer was lost, so it is unknown \
                 whether it took effect. It will not run again by itself: an operator \
                 reconciles it (`oncely ledger resolve {}`), then this task ends.",
                record.id
            ),
            record.updated_at.to_rfc3339(),
        ),
        TaskStatus::Completed => (
            "completed",
            format!("The call of `{tool}` completed."),
            record
                .completed_at
                .unwrap_or(record.updated_at)
                .to_rfc3339(),
        ),
        TaskStatus::Failed(failure) => {
            let code = failure.error.get("code").and_then(Value::as_i64);
            (
                "failed",
                format!(
                    "The call of `{tool}` failed with JSON-RPC error {}; nothing was \
                     stored, so calling it again runs it again (as a new task).",
                    code.unwrap_or(crate::jsonrpc::code::INTERNAL_ERROR)
                ),
                failure.at.clone(),
            )
        }
    };
    tasks::task(
        &tasks::task_id(&record.id, attempt),
        name,
        &message,
        &started,
        &updated,
        task_ttl_ms(config),
        task_poll_ms(config),
    )
}

/// What a `GetTaskResult` carries besides the task: the tool result of a completed
/// task, the JSON-RPC error of a failed one.
pub(super) fn task_payload(
    record: &Record,
    tool: &str,
    status: &TaskStatus,
) -> Option<(&'static str, Value)> {
    match status {
        TaskStatus::Working | TaskStatus::Unknown => None,
        TaskStatus::Completed => {
            let stored = record
                .response
                .as_ref()
                .and_then(|r| r.body.as_deref())
                .and_then(|b| serde_json::from_slice::<Value>(b).ok());
            let mut result = stored.unwrap_or_else(|| too_large_result(tool, record));
            for_revision(&mut result, true);
            Some(("result", result))
        }
        TaskStatus::Failed(failure) => Some(("error", failure.error.clone())),
    }
}
