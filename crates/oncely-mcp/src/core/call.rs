//! A guarded `tools/call` as the guard reads it ([`Call`]), and the refusal of a
//! `tools/call` that cannot be read as one call to guard. Read from plain inputs: the
//! JSON-RPC message, its text as written, and what its transport knows of it (its
//! caller, whose principal it reads, and its protocol era).

use std::sync::Mutex;

use oncely_tower::trace::{attr, Span};
use oncely_tower::GuardedCall;
use serde_json::Value;

use super::context::Context;
use super::message_span::MessageSpan;
use super::shared::Shared;
use crate::jsonrpc::code;
use crate::jsonrpc::{self, ToolCall};
use crate::tasks;

/// Why a `tools/call` that repeats a member name is refused: servers disagree on which of
/// the values counts (most take the last, some the first, some refuse), so oncely cannot
/// know which call it would be guarding.
const REPEATED_NAME: &str = "the tools/call repeats a member name in its JSON; send each \
    member once (servers disagree on which value counts, so oncely cannot guard it)";

/// One guarded call, as read from its request.
pub(super) struct Call {
    pub(super) id: Value,
    pub(super) tool: String,
    pub(super) guarded: GuardedCall,
    /// The session negotiated 2026-07-28 (or later): results carry `resultType`.
    pub(super) modern: bool,
    /// The request declared the tasks extension (2026-07-28): a call that outlives
    /// `wait` is answered with a task.
    pub(super) tasks: bool,
    /// With `tasks`, the protocol's own `_meta` members of the call
    /// (`io.modelcontextprotocol/*`), which the owner's requests about a task the server
    /// made of the call carry too; empty otherwise.
    pub(super) protocol_meta: Value,
    /// The call's server span (traces on), ended by `observe`.
    pub(super) span: Mutex<Option<Span>>,
    /// The arguments (JSON pointers) that are idempotency keys the model filled in: not
    /// part of the key, and given the record's derived key when the owner sends the
    /// call (those whose schema admits a UUID; the others as sent).
    pub(super) key_arguments: Vec<KeyArgument>,
    /// The hash of the values the model gave its key arguments (`None`: no key
    /// argument present), to tell a key made up for a retry (`made_keys`).
    pub(super) made_key: Option<u64>,
}

/// One key argument of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeyArgument {
    pub(super) pointer: String,
    /// The server gets the record's key in the UUID layout in it; else the model's.
    pub(super) replaced: bool,
}

/// Reads a guarded call, or `None` when it is forwarded as it is.
/// `text` is `message` as it was written; `context` what its transport knows of it;
/// `span` the message's span, which a guarded call takes (and the engine ends).
pub(super) fn read_call<O>(
    core: &Shared,
    context: &Context<O>,
    message: &Value,
    text: &str,
    span: &mut Option<MessageSpan>,
) -> Option<Call> {
    let modern = context.modern;
    let request = jsonrpc::as_request(message)?;
    let read = ToolCall::read(message, text)?;
    let tool = read.tool;
    if !core.catalog.is_guarded(&core.config.tools, tool) {
        return None;
    }
    let policy = core.config.policy_of(tool);
    // The principal's keyed hash is the gateway's (`Guard::principal_hash`), so one
    // account is one principal on HTTP routes and MCP endpoints alike; a call that
    // names none is forwarded as it is.
    let facts = context.caller.facts(&core.guard, &core.config);
    let principal = facts.principal?;
    // The units rule sees the call's arguments as the body (`{}` when absent).
    let arguments = read.arguments.unwrap_or("{}");
    let units = core.config.units.units_of(arguments.as_bytes());
    // The texts as written, not as `message` holds them: a parsed number is a double
    // once it is past 64 bits or has many digits.
    let arguments_value = message.pointer("/params/arguments").unwrap_or(&Value::Null);
    let key_arguments = key_arguments(core, tool, arguments_value);
    let ignored: Vec<String> = key_arguments.iter().map(|k| k.pointer.clone()).collect();
    let made_key = super::made_keys::values_of(arguments_value, ignored.iter().map(String::as_str));
    let intent = core.config.intent_of(tool);
    let fingerprint = read.fingerprint_of(&principal, &core.config.path, &ignored, intent);
    // The message's span (with the MCP conventions) is the call's.
    let span = span.take().map(|span| {
        let mut span = span.into_span();
        span.set(attr::CLASS, policy.class.as_str());
        span.set(attr::KEY_SOURCE, "fingerprint");
        span
    });
    let declared = modern && tasks::declares_tasks(request.params);
    let mut guarded = policy.guarded_call(principal, None, fingerprint, facts.workflow_id, units);
    // The record keeps the span that executes it: replays and joins link to it.
    guarded.trace = span.as_ref().map(Span::span_ref);
    Some(Call {
        span: Mutex::new(span),
        id: request.id.clone(),
        tool: tool.to_string(),
        modern,
        tasks: declared,
        protocol_meta: if declared {
            tasks::protocol_meta(message)
        } else {
            Value::Object(Default::default())
        },
        guarded,
        key_arguments,
        made_key,
    })
}

/// The key arguments of a call of `tool` with `arguments`, each replaced unless the tool's
/// listed schema for it rules a UUID out (a tool not listed yet: replaced).
fn key_arguments(core: &Shared, tool: &str, arguments: &Value) -> Vec<KeyArgument> {
    let pointers = core.config.key_arguments.of(tool, arguments);
    if pointers.is_empty() {
        return Vec::new();
    }
    let schema = core.catalog.input_schema(tool);
    pointers
        .into_iter()
        .map(|pointer| {
            let replaced = schema
                .as_deref()
                .and_then(|s| crate::key_arguments::property(s, &pointer))
                .is_none_or(crate::key_arguments::admits_uuid);
            KeyArgument { pointer, replaced }
        })
        .collect()
}

/// The refusal of a `tools/call` that oncely cannot read as one call to guard, so that no
/// spelling of a call passes unguarded: one that repeats a member name (servers disagree
/// on which value counts), one without a usable id (a notification, or `"id": null`),
/// and one whose `params` is not an object with a string `name`. `None` for any other
/// message.
pub(crate) fn unreadable_call(message: &Value, text: &str) -> Option<Value> {
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        return None;
    }
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let refuse = |code, why: &str| Some(jsonrpc::error_message(&id, code, why));
    if oncely_core::canon::Json::parse(text.as_bytes()).is_none() {
        return refuse(code::INVALID_REQUEST, REPEATED_NAME);
    }
    if !matches!(id, Value::String(_) | Value::Number(_)) {
        return refuse(
            code::INVALID_REQUEST,
            "a tools/call needs a string or number id (oncely guards requests, not notifications)",
        );
    }
    if ToolCall::read(message, text).is_none() {
        return refuse(
            code::INVALID_PARAMS,
            "a tools/call needs params with a string name",
        );
    }
    None
}
