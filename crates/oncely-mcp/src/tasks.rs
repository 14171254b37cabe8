//! The `io.modelcontextprotocol/tasks` extension (2026-07-28), as oncely speaks it for the
//! calls it guards: a guarded `tools/call` that outlives `wait` is answered, to a client
//! that declared the extension on that request, with a task; `tasks/get` reads the
//! ledger; `tasks/cancel` is acknowledged and never cancels the shared execution;
//! `tasks/update` is acknowledged (a guarded call asks for no input through its task).
//!
//! # One task per execution
//!
//! A task is one execution of a call: one attempt of its ledger record. The first
//! attempt's task id is the record's id; a later attempt (the same call run again after
//! an attempt ended without a result) is a new task, `RECORD_ID.ATTEMPT`. So a task that
//! reached a terminal status never changes: a later execution never reuses its id.
//!
//! A failed attempt's JSON-RPC error has to outlive the attempt (the record moves on to
//! the next one), so the owner writes it into the record as a *task history*: the release
//! reason (`last_error`) of a failed attempt, and a stored header of a later completed
//! one, carry every earlier failed attempt's error and time ([`History`]).
//!
//! Only the shapes and that bookkeeping live here (see the extension's `schema.ts`:
//! `CreateTaskResult`, `GetTaskResult`, `CancelTaskResult`, `UpdateTaskResult`);
//! the endpoint decides when to use them.

use std::collections::BTreeMap;

use crate::jsonrpc::code;
use oncely_core::{Record, RecordId, State, Timestamp};
use serde_json::{json, Value};

/// The extension's identifier.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// The `_meta` key of a request's per-request client capabilities (2026-07-28).
pub const CLIENT_CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";

/// The stored header of a completed record that carries its earlier failed attempts.
pub const HISTORY_HEADER: &str = "oncely-task-history";

/// Most failed attempts a record's task history keeps.
pub const MAX_HISTORY: usize = 32;

/// What follows the reason in the `last_error` of a record whose attempt failed.
const HISTORY_MARK: &str = "\ntask history: ";

/// Whether a request's `params` declare the tasks extension in its per-request client
/// capabilities.
pub fn declares_tasks(params: Option<&Value>) -> bool {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(CLIENT_CAPABILITIES_META))
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some_and(Value::is_object)
}

/// The `_meta` members of a call that its follow-up requests carry: the protocol's own
/// (`io.modelcontextprotocol/*`: the revision, the client capabilities that declare the
/// tasks extension).
pub fn protocol_meta(message: &Value) -> Value {
    let kept = message
        .pointer("/params/_meta")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.starts_with("io.modelcontextprotocol/"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    Value::Object(kept)
}

/// The `error` of a request that did not declare the extension (-32021).
pub fn missing_capability_error() -> Value {
    json!({
        "code": code::MISSING_CAPABILITY,
        "message": "Missing required client capability: declare the io.modelcontextprotocol/tasks \
            extension in this request's _meta[\"io.modelcontextprotocol/clientCapabilities\"]",
        "data": {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
    })
}

/// The id of the task that is attempt `attempt` of `record`.
pub fn task_id(record: &RecordId, attempt: u32) -> String {
    if attempt <= 1 {
        record.as_str().to_string()
    } else {
        format!("{record}.{attempt}")
    }
}

/// The record and attempt a task id names, if it is one of oncely's (`rec_…` or
/// `rec_….N`, N ≥ 2).
pub fn parse_task_id(task_id: &str) -> Option<(RecordId, u32)> {
    if !task_id.starts_with("rec_") {
        return None;
    }
    match task_id.rsplit_once('.') {
        None => Some((RecordId(task_id.to_string()), 1)),
        Some((record, attempt)) => {
            let n: u32 = attempt.parse().ok()?;
            // One spelling per task: `rec_x.1` and `rec_x.02` are not ids oncely gave.
            (n >= 2 && attempt == n.to_string()).then(|| (RecordId(record.to_string()), n))
        }
    }
}

/// How one attempt that ended without a result ended: its JSON-RPC error (the server's
/// own, or -32603 with the reason oncely knows) and when.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The JSON-RPC `error` object.
    pub error: Value,
    /// When the attempt ended (RFC 3339).
    pub at: String,
}

/// Every failed attempt of a record, by attempt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History(pub BTreeMap<u32, Failure>);

impl History {
    /// The history a record carries: in the `last_error` of a failed attempt, or in the
    /// stored header of a completed one.
    pub fn of(record: &Record) -> History {
        let from_error = record
            .last_error
            .as_deref()
            .and_then(|e| e.split_once(HISTORY_MARK))
            .map(|(_, json)| json);
        let from_header = || {
            record.response.as_ref().and_then(|r| {
                r.headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(HISTORY_HEADER))
                    .map(|(_, v)| v.as_str())
            })
        };
        from_error
            .or_else(from_header)
            .map(History::parse)
            .unwrap_or_default()
    }

    fn parse(text: &str) -> History {
        let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) else {
            return History::default();
        };
        History(
            map.into_iter()
                .filter_map(|(k, v)| {
                    let error = v.get("error")?.clone();
                    let at = v.get("at")?.as_str()?.to_string();
                    Some((k.parse().ok()?, Failure { error, at }))
                })
                .collect(),
        )
    }

    /// The history as JSON text (`{"ATTEMPT": {"error": ..., "at": ...}}`).
    pub fn to_text(&self) -> String {
        let map: serde_json::Map<String, Value> = self
            .0
            .iter()
            .map(|(k, f)| (k.to_string(), json!({"error": f.error, "at": f.at})))
            .collect();
        Value::Object(map).to_string()
    }

    /// `reason` with this history after it, as the `last_error` of a failed attempt.
    pub fn reason(&self, reason: &str) -> String {
        if self.0.is_empty() {
            reason.to_string()
        } else {
            format!("{reason}{HISTORY_MARK}{}", self.to_text())
        }
    }

    /// This history with `attempt` failed with `error` now. At most [`MAX_HISTORY`]
    /// attempts are kept (the oldest go first), so that a call failing again and again
    /// within its window cannot grow its record without bound; the task of an attempt
    /// that was dropped reads `failed` with -32603.
    pub fn with(mut self, attempt: u32, error: Value) -> History {
        while self.0.len() >= MAX_HISTORY {
            self.0.pop_first();
        }
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let at = Timestamp(millis).to_rfc3339();
        self.0.insert(attempt, Failure { error, at });
        self
    }
}

/// The JSON-RPC error of an attempt that ended without a result, when oncely did not
/// keep the server's own: -32603 with what is known.
pub fn internal_error(message: &str) -> Value {
    json!({"code": code::INTERNAL_ERROR, "message": message})
}

/// A `Task`'s members (no `resultType`, no status payload).
pub fn task(
    task_id: &str,
    status: &str,
    status_message: &str,
    created_at: &str,
    last_updated_at: &str,
    ttl_ms: u64,
    poll_ms: u64,
) -> Value {
    json!({
        "taskId": task_id,
        "status": status,
        "statusMessage": status_message,
        "createdAt": created_at,
        "lastUpdatedAt": last_updated_at,
        "ttlMs": ttl_ms,
        "pollIntervalMs": poll_ms,
    })
}

/// The status attempt `attempt` of `record` has, and its payload: `working` while it runs
/// (or while nobody knows whether it took effect: an `outcome_unknown` record is not
/// final until it is reconciled), `completed` with the tool result once it has one,
/// `failed` with its JSON-RPC error when it ended without one. `None` when the record
/// has no such attempt.
pub fn status_of(record: &Record, attempt: u32) -> Option<TaskStatus> {
    if attempt > record.attempt || attempt == 0 {
        return None;
    }
    let history = History::of(record);
    if attempt < record.attempt {
        // Superseded: a later execution means this one ended without a result.
        return Some(TaskStatus::Failed(
            history.0.get(&attempt).cloned().unwrap_or(Failure {
                error: internal_error(
                    "this execution ended without a result; a later call ran the tool again \
                     as a new task",
                ),
                at: record.created_at.to_rfc3339(),
            }),
        ));
    }
    Some(match record.state {
        State::Processing => TaskStatus::Working,
        State::OutcomeUnknown => TaskStatus::Unknown,
        State::Completed => TaskStatus::Completed,
        State::Released => {
            TaskStatus::Failed(history.0.get(&attempt).cloned().unwrap_or_else(|| Failure {
                error: internal_error(&format!(
                    "the call ended without a result ({})",
                    reason_of(record)
                )),
                at: record.updated_at.to_rfc3339(),
            }))
        }
    })
}

/// A record's `last_error` without its task history.
pub fn reason_of(record: &Record) -> &str {
    let text = record.last_error.as_deref().unwrap_or("no result");
    text.split_once(HISTORY_MARK).map_or(text, |(r, _)| r)
}

/// Where a task is.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskStatus {
    /// Its execution runs.
    Working,
    /// Its execution was sent and its outcome is unknown until someone reconciles it.
    Unknown,
    /// It has a tool result.
    Completed,
    /// It ended without a result.
    Failed(Failure),
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
        assert!(declares_tasks(Some(&declared)));
        assert!(!declares_tasks(Some(&json!({"name": "x"}))));
        assert!(!declares_tasks(None));
        let other = json!({"_meta": {CLIENT_CAPABILITIES_META: {"extensions": {"x/y": {}}}}});
        assert!(!declares_tasks(Some(&other)));
    }

    #[test]
    fn a_call_s_protocol_meta_is_its_io_modelcontextprotocol_members() {
        let meta = protocol_meta(&json!({"params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "dev.oncely/idempotency-key": "k", "progressToken": 1}}}));
        assert_eq!(
            meta,
            json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"})
        );
    }

    #[test]
    fn each_attempt_is_its_own_task_id() {
        let id = RecordId("rec_0192abc".into());
        assert_eq!(task_id(&id, 1), "rec_0192abc");
        assert_eq!(task_id(&id, 3), "rec_0192abc.3");
        assert_eq!(parse_task_id("rec_0192abc"), Some((id.clone(), 1)));
        assert_eq!(parse_task_id("rec_0192abc.3"), Some((id, 3)));
        for not_ours in [
            "upstream-task-1",
            "rec_x.1",
            "rec_x.03",
            "rec_x.",
            "rec_x.-2",
            "rec_x.9999999999",
        ] {
            assert_eq!(parse_task_id(not_ours), None, "{not_ours}");
        }
    }

    #[test]
    fn the_history_survives_as_reason_and_as_header() {
        let error = json!({"code": -32000, "message": "quota", "data": {"n": 1}});
        let history = History::default().with(1, error.clone());
        let reason = history.reason("JSON-RPC error (not stored)");
        let mut record = Record {
            last_error: Some(reason),
            ..sample()
        };
        assert_eq!(History::of(&record), history);
        assert_eq!(reason_of(&record), "JSON-RPC error (not stored)");
        record.last_error = None;
        record.response = Some(oncely_core::StoredResponse {
            status: 200,
            headers: vec![(HISTORY_HEADER.into(), history.to_text())],
            body: None,
        });
        assert_eq!(History::of(&record).0[&1].error, error);
        assert_eq!(History::default().reason("x"), "x");
        let mut long = History::default();
        for n in 1..=40 {
            long = long.with(n, json!({"code": n}));
        }
        assert_eq!(long.0.len(), MAX_HISTORY);
        assert_eq!(
            long.0.keys().next(),
            Some(&9),
            "the oldest attempts go first"
        );
    }

    fn sample() -> Record {
        let spec = oncely_core::ClaimSpec {
            identity: oncely_core::Identity::new(
                "p".into(),
                "/mcp#t".into(),
                oncely_core::Class::Write,
                Some("k".into()),
                oncely_core::FingerprintBuilder::new("p", "m", "/").body(b"", &[]),
                None,
            ),
            owner: "o".into(),
            lease: std::time::Duration::from_secs(30),
        };
        Record::new_claim(RecordId("rec_1".into()), &spec, Timestamp(1_000))
    }
}
