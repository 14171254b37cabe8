//! JSON-RPC messages read as plain JSON.
//!
//! The proxy forwards bytes it did not change, and reads only the members it needs, so an
//! unknown field (a new protocol revision's, an extension's) is never dropped.

use serde_json::Value;

/// The `_meta` key oncely adds to a replayed or joined tool result.
pub const REPLAY_META_KEY: &str = "dev.oncely/replay";

/// The `_meta` key of a forwarded guarded `tools/call` that carries the derived downstream
/// idempotency key, for servers that deduplicate too.
pub const IDEMPOTENCY_KEY_META: &str = "dev.oncely/idempotency-key";

/// Members of a `tools/call` request's `params` that continue an earlier exchange
/// (task-augmented calls, multi-round-trip input): never deduplicated.
pub const CONTINUATION_PARAMS: &[&str] = &["task", "inputResponses", "requestState"];

/// A request (has `method` and `id`).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestView<'a> {
    /// The method.
    pub method: &'a str,
    /// The id, as sent (number or string).
    pub id: &'a Value,
    /// `params`, when present.
    pub params: Option<&'a Value>,
}

/// Reads `value` as a request, if it is one.
pub fn as_request(value: &Value) -> Option<RequestView<'_>> {
    let obj = value.as_object()?;
    let method = obj.get("method")?.as_str()?;
    let id = obj.get("id")?;
    if id.is_null() {
        return None;
    }
    Some(RequestView {
        method,
        id,
        params: obj.get("params"),
    })
}

/// Reads `value` as a notification (a `method` without `id`): its method and params.
pub fn as_notification(value: &Value) -> Option<(&str, Option<&Value>)> {
    let obj = value.as_object()?;
    if obj.contains_key("id") {
        return None;
    }
    Some((obj.get("method")?.as_str()?, obj.get("params")))
}

/// The `requestId` a `notifications/cancelled` names, as canonical text.
pub fn cancelled_request_id(value: &Value) -> Option<String> {
    match as_notification(value)? {
        ("notifications/cancelled", Some(params)) => params.get("requestId").map(id_text),
        _ => None,
    }
}

/// An id as text that tells `1` from `"1"`.
pub fn id_text(id: &Value) -> String {
    id.to_string()
}

/// What a response carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `result`.
    Result(Value),
    /// `error`.
    Error(Value),
}

/// Reads `value` as a response to the request `id`.
pub fn response_to(value: &Value, id: &Value) -> Option<Outcome> {
    let obj = value.as_object()?;
    if obj.contains_key("method") || obj.get("id") != Some(id) {
        return None;
    }
    if let Some(r) = obj.get("result") {
        return Some(Outcome::Result(r.clone()));
    }
    obj.get("error").map(|e| Outcome::Error(e.clone()))
}

/// A response with `result` for `id`.
pub fn result_message(id: &Value, result: Value) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error response.
pub fn error_message(id: &Value, code: i64, message: &str) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Adds `_meta[key] = value` to a result object (creating `_meta` when missing).
pub fn set_meta(result: &mut Value, key: &str, value: Value) {
    if let Some(obj) = result.as_object_mut() {
        let meta = obj
            .entry("_meta")
            .or_insert_with(|| Value::Object(Default::default()));
        if !meta.is_object() {
            *meta = Value::Object(Default::default());
        }
        if let Some(m) = meta.as_object_mut() {
            m.insert(key.to_string(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_requests_notifications_and_responses() {
        let req = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}});
        let view = as_request(&req).unwrap();
        assert_eq!(view.method, "tools/call");
        assert_eq!(view.id, &json!(7));
        assert!(as_notification(&req).is_none());
        let cancel =
            json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"7"}});
        assert_eq!(cancelled_request_id(&cancel).unwrap(), "\"7\"");
        assert_ne!(id_text(&json!(7)), id_text(&json!("7")));
        let resp = json!({"jsonrpc":"2.0","id":7,"result":{"content":[]}});
        assert_eq!(
            response_to(&resp, &json!(7)),
            Some(Outcome::Result(json!({"content":[]})))
        );
        assert_eq!(response_to(&resp, &json!("7")), None);
    }

    #[test]
    fn set_meta_keeps_other_meta_keys() {
        let mut r = json!({"content": [], "_meta": {"a": 1}});
        set_meta(&mut r, REPLAY_META_KEY, json!({"status": "replayed"}));
        assert_eq!(r["_meta"]["a"], 1);
        assert_eq!(r["_meta"][REPLAY_META_KEY]["status"], "replayed");
    }
}
