//! Passing a request through to the [`McpUpstream`](super::state::McpUpstream) unchanged and
//! streaming its answer back, with the answers oncely reads on the way edited: a
//! `tools/list` result (learnt from; guarded tools offer no task-augmented calls) and a
//! `server/discover` result (the tasks extension advertised).

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use oncely_http::problem::ProblemCode;
use serde_json::Value;

use super::headers::header_str;
use super::response::problem;
use super::state::{send, Inner};
use crate::body::{Edit, EditFn, McpBody};
use crate::tasks;

/// Most bytes of a JSON answer oncely reads to edit it (`tools/list`, `server/discover`);
/// a larger one passes through unread.
pub(super) const EDIT_LIMIT: usize = 8 << 20;

/// Whether oncely edits an answer it passes through, and how (see [`editor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AnswerEdit {
    /// A `tools/list` result: learnt from; guarded tools offer no task-augmented calls.
    ToolsList,
    /// A `server/discover` result: the tasks extension is advertised.
    Discover,
}

/// Forwards unchanged and streams the answer back, with the responses to the requests
/// `edits` names edited on the way (see [`AnswerEdit`]).
pub(super) async fn forward(
    inner: Arc<Inner>,
    parts: http::request::Parts,
    body: Bytes,
    edits: Vec<(Value, AnswerEdit)>,
) -> Response<McpBody> {
    let req = inner.upstream_request(&parts, body);
    let resp = match send(inner.upstream.clone(), req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(route = %inner.config.path, error = %e, "upstream unreachable");
            return problem(
                ProblemCode::UpstreamUnreachable,
                "the MCP server could not be reached",
            );
        }
    };
    let (mut rparts, body) = resp.into_parts();
    let body: McpBody = if edits.is_empty() || !rparts.status.is_success() {
        body
    } else {
        let is_sse = header_str(&rparts.headers, "content-type")
            .is_some_and(|c| c.to_ascii_lowercase().starts_with("text/event-stream"));
        // An edited answer has another length.
        rparts.headers.remove(http::header::CONTENT_LENGTH);
        Edit::new(body, is_sse, EDIT_LIMIT, editor(inner, edits)).boxed()
    };
    Response::from_parts(rparts, body)
}

/// What [`Edit`] does to the responses to the requests `edits` names.
fn editor(inner: Arc<Inner>, edits: Vec<(Value, AnswerEdit)>) -> EditFn {
    Box::new(move |message: &mut Value| {
        let Some(answer) = edits
            .iter()
            .find(|(id, _)| message.get("id") == Some(id))
            .map(|(_, a)| *a)
        else {
            return false;
        };
        let Some(result) = message.get_mut("result").filter(|r| r.is_object()) else {
            return false;
        };
        match answer {
            AnswerEdit::ToolsList => {
                inner.catalog.observe_list(result);
                forbid_tasks(&inner, result)
            }
            AnswerEdit::Discover => advertise_tasks(result),
        }
    })
}

/// Sets `execution.taskSupport` to `forbidden` on every guarded tool of a `tools/list`
/// result that offered task-augmented calls (2025-11-25): a client then calls it as
/// a plain call, the one oncely guards. Says whether it changed anything.
fn forbid_tasks(inner: &Inner, result: &mut Value) -> bool {
    let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else {
        return false;
    };
    let mut changed = false;
    for tool in tools {
        let guarded = tool
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|name| inner.catalog.is_guarded(&inner.config.tools, name));
        let support = tool.pointer_mut("/execution/taskSupport");
        if let (true, Some(support)) = (guarded, support) {
            if support.as_str() != Some("forbidden") {
                *support = Value::String("forbidden".into());
                changed = true;
            }
        }
    }
    changed
}

/// Adds `capabilities.extensions["io.modelcontextprotocol/tasks"]` to a `server/discover`
/// result: oncely answers tasks for the calls it guards, whatever the server speaks.
fn advertise_tasks(result: &mut Value) -> bool {
    let Some(obj) = result.as_object_mut() else {
        return false;
    };
    let object = || Value::Object(Default::default());
    let capabilities = obj.entry("capabilities").or_insert_with(object);
    let Some(capabilities) = capabilities.as_object_mut() else {
        return false;
    };
    let extensions = capabilities.entry("extensions").or_insert_with(object);
    match extensions.as_object_mut() {
        Some(e) if !e.contains_key(tasks::TASKS_EXTENSION) => {
            e.insert(tasks::TASKS_EXTENSION.into(), object());
            true
        }
        _ => false,
    }
}
