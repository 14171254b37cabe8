//! The `io.modelcontextprotocol/tasks` extension (2026-07-28), as oncely speaks it for the
//! calls it guards: a guarded `tools/call` that outlives `wait` is answered, to a client
//! that declared the extension on that request, with a task whose id is the ledger
//! record's; `tasks/get` reads the record; `tasks/cancel` detaches that client only.
//!
//! Only the JSON shapes live here (see the extension's `schema.ts`: `CreateTaskResult`,
//! `GetTaskResult`, `CancelTaskResult`); [`crate::endpoint`] decides when to use them.

use oncely_core::{Record, State};
use serde_json::{json, Value};

/// The extension's identifier.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// The `_meta` key of a request's per-request client capabilities (2026-07-28).
pub const CLIENT_CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";

/// Whether a request's `params` declare the tasks extension in its per-request client
/// capabilities.
pub fn declares_tasks(params: &Value) -> bool {
    params
        .get("_meta")
        .and_then(|m| m.get(CLIENT_CAPABILITIES_META))
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some_and(Value::is_object)
}

/// The status a task of `record` has: `working` while it runs, `completed` once it has a
/// result to give (stored, too large, or awaiting reconciliation: each is a tool result),
/// `failed` when it ended without one (released).
pub fn status_of(record: &Record) -> &'static str {
    match record.state {
        State::Processing => "working",
        State::Completed | State::OutcomeUnknown => "completed",
        State::Released => "failed",
    }
}

/// The `Task` members of `record` (no `resultType`, no status payload).
pub fn task(record: &Record, status_message: &str, ttl_ms: u64, poll_ms: u64) -> Value {
    json!({
        "taskId": record.id.as_str(),
        "status": status_of(record),
        "statusMessage": status_message,
        "createdAt": record.created_at.to_rfc3339(),
        "lastUpdatedAt": record.updated_at.to_rfc3339(),
        "ttlMs": ttl_ms,
        "pollIntervalMs": poll_ms,
    })
}

/// A `CreateTaskResult`: the task, `resultType: "task"`.
pub fn create_task_result(mut task: Value) -> Value {
    if let Some(obj) = task.as_object_mut() {
        obj.insert("resultType".into(), Value::String("task".into()));
    }
    task
}

/// A `GetTaskResult`: the task, its status payload (`result` or `error`), and
/// `resultType: "complete"`.
pub fn get_task_result(mut task: Value, payload: Option<(&str, Value)>) -> Value {
    if let Some(obj) = task.as_object_mut() {
        obj.insert("resultType".into(), Value::String("complete".into()));
        if let Some((key, value)) = payload {
            obj.insert(key.into(), value);
        }
    }
    task
}

/// The empty acknowledgement of `tasks/cancel` and `tasks/update`.
pub fn acknowledgement() -> Value {
    json!({"resultType": "complete"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_is_declared_per_request() {
        let declared = json!({"name": "x", "_meta": {CLIENT_CAPABILITIES_META: {"extensions": {TASKS_EXTENSION: {}}}}});
        assert!(declares_tasks(&declared));
        assert!(!declares_tasks(&json!({"name": "x"})));
        let other = json!({"_meta": {CLIENT_CAPABILITIES_META: {"extensions": {"x/y": {}}}}});
        assert!(!declares_tasks(&other));
    }
}
