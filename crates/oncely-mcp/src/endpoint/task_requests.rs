//! The tasks extension's requests (`tasks/get`, `tasks/cancel`, `tasks/update`,
//! 2026-07-28): this endpoint's tasks (`rec_…`) are answered from the ledger, any other
//! task id is the server's own and is forwarded.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use oncely_tower::RequestHead;
use serde_json::{json, Value};

use super::forward::{forward, EDIT_LIMIT};
use super::headers::{header_mismatch, HEADER_MISMATCH, TASK_ID};
use super::response::{json_response, messages_in};
use super::results::{task, task_payload};
use super::state::Inner;
use crate::body::{full, McpBody};
use crate::jsonrpc::{self, Outcome};
use crate::tasks;

/// `tasks/get`, `tasks/cancel` or `tasks/update` of the 2026-07-28 extension. Checked
/// as the extension says (routing headers, the declared extension, a known task of
/// this principal) before anything else; this endpoint's tasks (`rec_…`) are
/// answered from the ledger, any other task id is the server's own and is forwarded.
pub(super) async fn task_request(
    inner: Arc<Inner>,
    parts: http::request::Parts,
    bytes: Bytes,
    message: Value,
) -> Response<McpBody> {
    let Some(request) = jsonrpc::as_request(&message) else {
        return forward(inner, parts, bytes, Vec::new()).await;
    };
    let id = &request.id.clone();
    let method = request.method.to_string();
    if let Some(mismatch) = header_mismatch(&parts.headers, &message, TASK_ID) {
        return json_response(
            StatusCode::BAD_REQUEST,
            &jsonrpc::error_message(id, HEADER_MISMATCH, &mismatch),
        );
    }
    if !tasks::declares_tasks(request.params) {
        return json_response(
            StatusCode::OK,
            &jsonrpc::error_value(id, tasks::missing_capability_error()),
        );
    }
    let Some(task_id) = request
        .params
        .and_then(|p| p.get("taskId"))
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return task_not_found(id, "params.taskId is missing");
    };
    let Some((record_id, attempt)) = tasks::parse_task_id(&task_id) else {
        return forward_task_request(inner, parts, bytes, id.clone()).await;
    };
    // Only the principal whose call it is reads a task.
    let principal = inner
        .config
        .principal
        .make_principal(&RequestHead::of_parts(&parts))
        .map(|raw| inner.guard.principal_hash(&raw));
    let Some(principal) = principal else {
        return task_not_found(id, "Task not found");
    };
    let store = inner.guard.store();
    let read = match tokio::time::timeout(oncely_tower::STORE_ANSWER, store.get(&record_id)).await {
        Ok(read) => read.map_err(|e| e.to_string()),
        Err(_) => Err("the ledger did not answer in time".to_string()),
    };
    let record = match read {
        Ok(Some(record)) => record,
        Ok(None) => return task_not_found(id, "Task not found"),
        Err(e) => {
            tracing::error!(route = %inner.config.path, error = %e, "ledger unavailable: {method}");
            return json_response(
                StatusCode::OK,
                &jsonrpc::error_message(id, -32603, "the ledger cannot be reached"),
            );
        }
    };
    let tool = record
        .route
        .strip_prefix(inner.config.path.as_str())
        .and_then(|r| r.strip_prefix('#'));
    // Another principal's task is as unknown as one that never was.
    let (Some(tool), true) = (tool, record.principal == principal) else {
        return task_not_found(id, "Task not found");
    };
    let Some(status) = tasks::status_of(&record, attempt) else {
        return task_not_found(id, "Task not found");
    };
    let result = match method.as_str() {
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
            return json_response(
                StatusCode::OK,
                &jsonrpc::error_message(id, -32601, &format!("Method not found: {other}")),
            )
        }
    };
    json_response(StatusCode::OK, &jsonrpc::result_message(id, result))
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
            &jsonrpc::error_message(&id, -32603, "the MCP server's answer broke off"),
        );
    };
    let unknown_method = messages_in(&rparts.headers, &bytes).iter().any(|m| {
        matches!(jsonrpc::response_to(m, &id), Some(Outcome::Error(e)) if e.get("code") == Some(&json!(-32601)))
    });
    let not_served = matches!(status.as_u16(), 404 | 405 | 501);
    if unknown_method || not_served {
        return task_not_found(&id, "Task not found");
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

/// The -32602 a `tasks/*` request gets for a task it cannot have: unknown, expired, or
/// another principal's (told apart from none of them).
fn task_not_found(id: &Value, why: &str) -> Response<McpBody> {
    json_response(
        StatusCode::OK,
        &jsonrpc::error_message(
            id,
            tasks::INVALID_PARAMS,
            &format!("Failed to retrieve task: {why}"),
        ),
    )
}
