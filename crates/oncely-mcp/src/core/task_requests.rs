//! The tasks extension's requests (`tasks/get`, `tasks/cancel`, `tasks/update`,
//! 2026-07-28) for this endpoint's tasks (`rec_…`), answered from the ledger as plain
//! JSON-RPC messages; a task id that is not one of oncely's is the server's own, for the
//! transport to forward. The transport checks what the request's carrier must carry (the
//! routing headers) before.

use serde_json::Value;

use super::results::{task, task_payload};
use super::shared::Shared;
use crate::jsonrpc::code;
use crate::jsonrpc::{self, RequestView};
use crate::tasks;

/// What becomes of a `tasks/*` request.
pub(super) enum TaskAnswer {
    /// Answered: the JSON-RPC message (a result or an error) to send back.
    Answered(Value),
    /// Refused as a protocol error (the extension not declared): the JSON-RPC error,
    /// which HTTP answers with status 400.
    Refused(Value),
    /// The task is not one of oncely's: the server's own, the request forwarded to it.
    Forward,
}

/// Answers `request`, a `tasks/get`, `tasks/cancel` or `tasks/update` of the 2026-07-28
/// extension, checked as the extension says (the declared extension, a known task of
/// this principal) before anything else. `principal` reads the caller's principal (its
/// keyed hash), asked only when the task is one of oncely's.
pub(super) async fn answer(
    inner: &Shared,
    request: &RequestView<'_>,
    principal: impl FnOnce() -> Option<String>,
) -> TaskAnswer {
    let id = request.id;
    let method = request.method;
    if !tasks::declares_tasks(request.params) {
        return TaskAnswer::Refused(jsonrpc::error_value(id, tasks::missing_capability_error()));
    }
    let Some(task_id) = request
        .params
        .and_then(|p| p.get("taskId"))
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return TaskAnswer::Answered(task_not_found(id, "params.taskId is missing"));
    };
    let Some((record_id, attempt)) = tasks::parse_task_id(&task_id) else {
        return TaskAnswer::Forward;
    };
    // Only the principal whose call it is reads a task.
    let Some(principal) = principal() else {
        return TaskAnswer::Answered(task_not_found(id, "Task not found"));
    };
    let store = inner.guard.store();
    // The store bounds the read (`oncely_store::Bounded`).
    let record = match store.get(&record_id).await {
        Ok(Some(record)) => record,
        Ok(None) => return TaskAnswer::Answered(task_not_found(id, "Task not found")),
        Err(e) => {
            tracing::error!(route = %inner.config.path, error = %e, "ledger unavailable: {method}");
            return TaskAnswer::Answered(jsonrpc::error_message(
                id,
                code::INTERNAL_ERROR,
                "the ledger cannot be reached",
            ));
        }
    };
    let tool = record
        .route
        .strip_prefix(inner.config.path.as_str())
        .and_then(|r| r.strip_prefix('#'));
    // Another principal's task is as unknown as one that never was.
    let (Some(tool), true) = (tool, record.principal == principal) else {
        return TaskAnswer::Answered(task_not_found(id, "Task not found"));
    };
    let Some(status) = tasks::status_of(&record, attempt) else {
        return TaskAnswer::Answered(task_not_found(id, "Task not found"));
    };
    let result = match method {
        "tasks/get" => {
            let payload = task_payload(&record, tool, &status);
            let task = task(&inner.config, &record, attempt, tool, &status);
            tasks::get_task_result(task, payload)
        }
        "tasks/cancel" => {
            tracing::info!(route = %record.route, record = %record.id, attempt,
                "tasks/cancel acknowledged: the shared execution runs on");
            tasks::acknowledgement()
        }
        "tasks/update" => {
            // A guarded call asks for no input through its task: every inputResponses
            // key is one that is not outstanding, and is ignored.
            tasks::acknowledgement()
        }
        other => {
            return TaskAnswer::Answered(jsonrpc::error_message(
                id,
                code::METHOD_NOT_FOUND,
                &format!("Method not found: {other}"),
            ))
        }
    };
    TaskAnswer::Answered(jsonrpc::result_message(id, result))
}

/// The -32602 a `tasks/*` request gets for a task it cannot have: unknown, expired, or
/// another principal's (told apart from none of them).
pub(super) fn task_not_found(id: &Value, why: &str) -> Value {
    jsonrpc::error_message(
        id,
        code::INVALID_PARAMS,
        &format!("Failed to retrieve task: {why}"),
    )
}
