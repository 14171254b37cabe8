//! A guarded call that the server runs as a task, followed by the call's owner to its
//! end, so that the ledger records the tool's result and not the server's task: a tool
//! the server runs only as a task (`execution.taskSupport: "required"`, 2025-11-25) is
//! called with `task`, and a call of a client that declared the tasks extension
//! (2026-07-28) may be answered with one. Either way the owner polls `tasks/get` on the
//! call's own session (tasks are the session's) at the server's `pollInterval`, then
//! reads the result (2025-11-25: `tasks/result`; 2026-07-28: the `result` or `error` of
//! the terminal `tasks/get`), and answers the call with it as if the server had answered
//! the call plainly. The client sees one call, and its task (if it asked for one) is the
//! record's, never the server's.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::server::{messages_in, read_whole, Framing, Outgoing};
use super::{Core, Server};
use crate::jsonrpc::{self, Outcome};

/// The `task` a call of a tool that the server runs only as a task is sent with: the
/// server keeps the task (and its result) 5 minutes after it ends.
pub(super) const TASK_PARAM_VALUE: &str = r#"{"ttl":300000}"#;

/// The poll interval when the server names none, and the bounds of one it names.
const DEFAULT_POLL: Duration = Duration::from_secs(1);
const MIN_POLL: Duration = Duration::from_millis(50);
const MAX_POLL: Duration = Duration::from_secs(5);

/// The `_meta` member of a result that names the task it is the result of.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// The server's task that a `tools/call` was answered with.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ServerTask {
    id: String,
    poll: Duration,
    /// How long the server keeps the task: past it, following it is given up.
    ttl: Option<Duration>,
    /// 2026-07-28's extension (the result comes with the terminal `tasks/get`).
    modern: bool,
}

impl ServerTask {
    /// The server's task a `tools/call` result is, if it is one: 2025-11-25's
    /// `CreateTaskResult` (`{"task": {"taskId", ...}}`), or 2026-07-28's
    /// (`resultType: "task"` with the task's members).
    pub(super) fn of(result: &Value) -> Option<ServerTask> {
        let (task, modern) = if result.get("resultType").and_then(Value::as_str) == Some("task") {
            (result, true)
        } else {
            let task = result.get("task").filter(|t| t.is_object())?;
            (task, false)
        };
        let id = task.get("taskId")?.as_str()?.to_string();
        let millis = |names: [&str; 2]| {
            names
                .iter()
                .find_map(|n| task.get(*n).and_then(Value::as_u64))
                .map(Duration::from_millis)
        };
        let poll = millis(["pollInterval", "pollIntervalMs"])
            .unwrap_or(DEFAULT_POLL)
            .clamp(MIN_POLL, MAX_POLL);
        Some(ServerTask {
            id,
            poll,
            ttl: millis(["ttl", "ttlMs"]),
            modern,
        })
    }
}

/// What following a server's task ends with: the call's outcome, or why it cannot be
/// known (the task was created, so the tool may have run).
enum Followed {
    Outcome(Outcome),
    Lost(String),
}

impl<S: Server> Core<S> {
    /// The answer to the call `id` as its owner hands it on: `body` (framed as `framing`)
    /// as it came, or, when it is a server's task, the call's response once the task
    /// ended (no response at all when it cannot be followed to its end: it may have run).
    /// `origin` is the call's, so that its follow-up requests go on its session; `meta`
    /// the `_meta` members they carry (the call's `io.modelcontextprotocol/*` ones).
    pub(super) async fn answer_of_task(
        self: Arc<Self>,
        id: &Value,
        framing: Framing,
        body: Vec<u8>,
        origin: S::Origin,
        meta: Value,
    ) -> Bytes {
        let task =
            messages_in(framing, &body)
                .iter()
                .find_map(|m| match jsonrpc::response_to(m, id) {
                    Some(Outcome::Result(r)) => ServerTask::of(&r),
                    _ => None,
                });
        let Some(task) = task else {
            return body.into();
        };
        tracing::info!(route = %self.config.path, server_task = %task.id,
            "the server runs the call as a task: oncely follows it to its end");
        let message = match self.follow(&task, &origin, &meta).await {
            Followed::Outcome(Outcome::Result(mut result)) => {
                unrelate(&mut result);
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            }
            Followed::Outcome(Outcome::Error(error)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": error})
            }
            Followed::Lost(why) => {
                tracing::warn!(route = %self.config.path, server_task = %task.id, %why,
                    "the server's task could not be followed to its end: the call may have run");
                return Bytes::new();
            }
        };
        frame(framing, &message)
    }

    /// Polls `task` until it ends, then reads its outcome.
    async fn follow(&self, task: &ServerTask, origin: &S::Origin, meta: &Value) -> Followed {
        let started = Instant::now();
        let params = |meta: &Value| {
            let mut p = json!({"taskId": task.id});
            if meta.as_object().is_some_and(|m| !m.is_empty()) {
                p["_meta"] = meta.clone();
            }
            p
        };
        let mut n = 0u64;
        loop {
            n += 1;
            tokio::time::sleep(task.poll).await;
            let status = match self.ask(origin, "tasks/get", params(meta), n).await {
                Ok(Outcome::Result(status)) => status,
                Ok(Outcome::Error(e)) => return Followed::Lost(format!("tasks/get: {e}")),
                Err(why) => return Followed::Lost(why),
            };
            match status.get("status").and_then(Value::as_str) {
                Some("working") => {
                    if task.ttl.is_some_and(|ttl| started.elapsed() > ttl) {
                        return Followed::Lost("the task outlived its ttl".into());
                    }
                }
                Some("input_required") => {
                    return Followed::Lost(
                        "the server's task asks for input, which oncely cannot give".into(),
                    )
                }
                Some(end @ ("completed" | "failed" | "cancelled")) => {
                    if !task.modern {
                        return match self.ask(origin, "tasks/result", params(meta), n).await {
                            Ok(outcome) => Followed::Outcome(outcome),
                            Err(why) => Followed::Lost(why),
                        };
                    }
                    let outcome = match (end, status.get("result"), status.get("error")) {
                        ("completed", Some(result), _) => Outcome::Result(result.clone()),
                        (_, _, Some(error)) => Outcome::Error(error.clone()),
                        _ => Outcome::Error(crate::tasks::internal_error(&format!(
                            "the server's task ended {end} without a result"
                        ))),
                    };
                    return Followed::Outcome(outcome);
                }
                other => {
                    return Followed::Lost(format!("tasks/get answered status {other:?}"));
                }
            }
        }
    }

    /// Sends the owner's request `method` with `params` on the call's session, and reads
    /// its response.
    async fn ask(
        &self,
        origin: &S::Origin,
        method: &str,
        params: Value,
        n: u64,
    ) -> Result<Outcome, String> {
        let id = Value::String(format!("oncely-{method}-{n}"));
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let answer = self
            .server
            .send(Outgoing {
                bytes: message.to_string().into(),
                origin,
                owner: true,
                span: None,
                own: true,
            })
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        if let Some(refused) = answer.refused {
            return Err(format!("{method}: {}", refused.reason));
        }
        let framing = answer.framing;
        let body = read_whole(answer.body)
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        messages_in(framing, &body)
            .iter()
            .find_map(|m| jsonrpc::response_to(m, &id))
            .ok_or_else(|| format!("{method}: the answer holds no response"))
    }
}

/// A task's result without the `_meta` member that names the server's task: the call
/// the client made was not one.
fn unrelate(result: &mut Value) {
    if let Some(meta) = result.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.remove(RELATED_TASK);
        if meta.is_empty() {
            if let Some(obj) = result.as_object_mut() {
                obj.remove("_meta");
            }
        }
    }
}

/// `message` framed as an answer of `framing` holds it.
fn frame(framing: Framing, message: &Value) -> Bytes {
    match framing {
        Framing::EventStream => format!("event: message\ndata: {message}\n\n").into(),
        Framing::Json | Framing::Nothing => serde_json::to_vec(message).unwrap_or_default().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_read_in_each_revision_and_a_tool_result_is_none() {
        let old = json!({"task": {"taskId": "t-1", "status": "working", "ttl": 300000,
            "pollInterval": 1000, "createdAt": "2026-12-07T10:00:00Z"}});
        assert_eq!(
            ServerTask::of(&old),
            Some(ServerTask {
                id: "t-1".into(),
                poll: Duration::from_secs(1),
                ttl: Some(Duration::from_secs(300)),
                modern: false,
            })
        );
        let modern = json!({"resultType": "task", "taskId": "t-2", "status": "working",
            "pollIntervalMs": 1});
        assert_eq!(
            ServerTask::of(&modern),
            Some(ServerTask {
                id: "t-2".into(),
                poll: MIN_POLL,
                ttl: None,
                modern: true,
            })
        );
        assert_eq!(
            ServerTask::of(&json!({"content": [{"type": "text", "text": "done"}]})),
            None
        );
        assert_eq!(ServerTask::of(&json!({"task": "not a task"})), None);
        assert_eq!(
            ServerTask::of(&json!({"task": {"status": "working"}})),
            None
        );
    }

    #[test]
    fn a_result_loses_only_the_related_task() {
        let mut r = json!({"content": [], "_meta": {RELATED_TASK: {"taskId": "t"}}});
        unrelate(&mut r);
        assert_eq!(r, json!({"content": []}));
        let mut r = json!({"content": [], "_meta": {RELATED_TASK: {"taskId": "t"}, "x": 1}});
        unrelate(&mut r);
        assert_eq!(r, json!({"content": [], "_meta": {"x": 1}}));
    }

    #[test]
    fn an_answer_is_framed_as_it_came() {
        let m = json!({"jsonrpc": "2.0", "id": 1, "result": {}});
        assert_eq!(
            frame(Framing::EventStream, &m),
            Bytes::from(format!("event: message\ndata: {m}\n\n"))
        );
        assert_eq!(frame(Framing::Json, &m), Bytes::from(m.to_string()));
    }
}
