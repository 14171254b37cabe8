//! JSON-RPC messages read as plain JSON.
//!
//! The proxy forwards bytes it did not change, and reads only the members it needs, so an
//! unknown field (a new protocol revision's, an extension's) is never dropped.

use oncely_core::{Fingerprint, FingerprintBuilder};
use serde::de::{Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

/// The JSON-RPC error codes oncely answers with, in one place: JSON-RPC's own and the
/// ones MCP adds.
pub mod code {
    /// JSON-RPC's "Parse error": a message that is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// JSON-RPC's "Invalid Request": a message that is not a request, or a `tools/call`
    /// whose JSON repeats a member name.
    pub const INVALID_REQUEST: i64 = -32600;
    /// JSON-RPC's "Method not found".
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// JSON-RPC's "Invalid params": what an unknown (or another principal's) task id gets.
    pub const INVALID_PARAMS: i64 = -32602;
    /// JSON-RPC's "Internal error", for an answer oncely could not give as a result.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// MCP 2026-07-28: routing headers that disagree with the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// The tasks extension: the request needs a client capability it did not declare.
    pub const MISSING_CAPABILITY: i64 = -32021;
}

/// The `_meta` key oncely adds to a replayed or joined tool result.
pub const REPLAY_META_KEY: &str = "dev.oncely/replay";

/// The `_meta` key of a forwarded guarded `tools/call` that carries the derived downstream
/// idempotency key, for servers that deduplicate too.
pub const IDEMPOTENCY_KEY_META: &str = "dev.oncely/idempotency-key";

/// The member of a `tools/call`'s `params` that asked for a task in 2025-11-25, and that
/// 2026-07-28 says to ignore: a guarded call is keyed without it and forwarded without
/// it, so that it runs as a plain call (and its result is one to store and replay).
pub const TASK_PARAM: &str = "task";

/// Parses a JSON-RPC message (or batch). JSON that `serde_json` cannot hold as a `Value`
/// (a number past the range of a double, such as `1e400`) is still a message: each such
/// number is read as its canonical text (a string) and every other part as `serde_json`
/// reads it, so a `tools/call` carrying one is guarded like any other (its arguments are
/// fingerprinted and forwarded from the text as written) instead of passing unguarded as
/// if it were not JSON.
pub fn parse(body: &[u8]) -> Option<Value> {
    if let Ok(v) = serde_json::from_slice(body) {
        return Some(v);
    }
    if !oncely_core::canon::is_json(body) {
        return None;
    }
    // It is JSON (so any `"` outside a string opens one, and a number is a run of these
    // characters outside strings): quote the numbers serde_json refuses, in one pass.
    let text = std::str::from_utf8(body).ok()?;
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                let number = &text[start..i];
                if serde_json::from_str::<serde_json::Number>(number).is_err() {
                    let canonical = oncely_core::canon::canonical_number(number)
                        .map_or_else(|| number.to_string(), std::borrow::Cow::into_owned);
                    out.push_str(&text[copied..start]);
                    out.push_str(&Value::String(canonical).to_string());
                    copied = i;
                }
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[copied..]);
    serde_json::from_str(&out).ok()
}

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
    error_value(id, serde_json::json!({"code": code, "message": message}))
}

/// An error response carrying `error` (code, message and data) as it is.
pub fn error_value(id: &Value, error: Value) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": error})
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

/// The text of the last member `name` of the JSON object `object`, as it was written
/// (the member `serde_json::Value` keeps when a name repeats); `None` when `object` is not
/// a JSON object or has no such member.
pub fn member_text<'a>(object: &'a str, name: &str) -> Option<&'a str> {
    struct Find<'n>(&'n str);
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = Option<&'de RawValue>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == self.0 {
                    found = Some(map.next_value::<&'de RawValue>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let mut de = serde_json::Deserializer::from_str(object);
    let found = de.deserialize_map(Find(name)).ok()?;
    de.end().ok()?;
    found.map(RawValue::get)
}

/// The members of the JSON object `object`, names decoded and values as written, in
/// order (a repeated name too); `None` when `object` is not a JSON object.
fn members(object: &str) -> Option<Vec<(String, &str)>> {
    struct Members;
    impl<'de> Visitor<'de> for Members {
        type Value = Vec<(String, &'de str)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut members = Vec::new();
            while let Some(key) = map.next_key::<String>()? {
                members.push((key, map.next_value::<&'de RawValue>()?.get()));
            }
            Ok(members)
        }
    }
    let mut de = serde_json::Deserializer::from_str(object);
    let members = de.deserialize_map(Members).ok()?;
    de.end().ok()?;
    Some(members)
}

/// `members` with `name` set to `value` (where its last spelling was, else at the end)
/// and no other member of that name, as JSON text.
fn with_member(members: &[(String, &str)], name: &str, value: &str) -> String {
    let last = members.iter().rposition(|(k, _)| k == name);
    let mut out = String::from("{");
    let mut first = true;
    let mut push = |out: &mut String, k: &str, v: &str| {
        if !std::mem::take(&mut first) {
            out.push(',');
        }
        out.push_str(&Value::String(k.to_string()).to_string());
        out.push(':');
        out.push_str(v);
    };
    for (i, (k, v)) in members.iter().enumerate() {
        if Some(i) == last {
            push(&mut out, k, value);
        } else if k != name {
            push(&mut out, k, v);
        }
    }
    if last.is_none() {
        push(&mut out, name, value);
    }
    out.push('}');
    out
}

/// A guarded `tools/call` as it is forwarded: `params._meta["dev.oncely/idempotency-key"]
/// = key` (as [`set_meta`] would set it) and no [`TASK_PARAM`] (so that the server runs
/// it as a plain call), every other part as it was written, so that numbers reach the
/// server with all their digits; `None` when `message` is not a JSON object with object
/// `params`.
pub fn forwarded_call(message: &str, key: &str) -> Option<String> {
    forwarded_call_with(message, key, &[])
}

/// [`forwarded_call`] with more `_meta` members (name, value as text): the client span's
/// `traceparent` and `tracestate`.
pub fn forwarded_call_with(message: &str, key: &str, more: &[(&str, &str)]) -> Option<String> {
    let outer = members(message)?;
    let mut params = members(outer.iter().rev().find(|(k, _)| k == "params")?.1)?;
    params.retain(|(k, _)| k != TASK_PARAM);
    let meta = params
        .iter()
        .rev()
        .find(|(k, _)| k == "_meta")
        .and_then(|(_, m)| members(m))
        .unwrap_or_default();
    let key = Value::String(key.to_string()).to_string();
    let mut meta = with_member(&meta, IDEMPOTENCY_KEY_META, &key);
    for (name, value) in more {
        let value = Value::String(value.to_string()).to_string();
        meta = with_member(&members(&meta).unwrap_or_default(), name, &value);
    }
    let params = with_member(&params, "_meta", &meta);
    Some(with_member(&outer, "params", &params))
}

/// `message` (a JSON object with object `params`, as written) with `params[name]` set to
/// `value` (JSON text), every other member as written; `None` when it has no object
/// `params`. The owner of a guarded call asks the server for a task with it (`task`),
/// and a transport that renumbers requests names its own id in a cancellation.
pub fn with_param(message: &str, name: &str, value: &str) -> Option<String> {
    let outer = members(message)?;
    let params = members(outer.iter().rev().find(|(k, _)| k == "params")?.1)?;
    let params = with_member(&params, name, value);
    Some(with_member(&outer, "params", &params))
}

/// `message` (a `tools/call`, as written) with the argument `pointer` names (a JSON
/// pointer into `params.arguments`, through objects) set to `value` (JSON text), every
/// other part as written; `None` when the message has no such argument.
pub fn with_argument(message: &str, pointer: &str, value: &str) -> Option<String> {
    fn set(object: &str, tokens: &[String], value: &str) -> Option<String> {
        let (first, rest) = tokens.split_first()?;
        let members = members(object)?;
        let (_, current) = members.iter().rev().find(|(k, _)| k == first)?;
        let new = if rest.is_empty() {
            value.to_string()
        } else {
            set(current, rest, value)?
        };
        Some(with_member(&members, first, &new))
    }
    let tokens: Vec<String> = pointer
        .strip_prefix('/')?
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let path: Vec<String> = ["params".to_string(), "arguments".to_string()]
        .into_iter()
        .chain(tokens)
        .collect();
    set(message, &path, value)
}

/// `message` (a JSON object, as written) with its `id` set to `id` (JSON text), every
/// other member as written; `None` when `message` is not a JSON object. A transport that
/// renumbers requests (stdio) edits the id alone, so that arguments and results keep
/// every digit they were written with.
pub fn with_id(message: &str, id: &str) -> Option<String> {
    Some(with_member(&members(message)?, "id", id))
}

/// A `notifications/cancelled` (as written) naming `id` (JSON text) as its `requestId`
/// instead; `None` when it has no object `params`.
pub fn with_cancelled_id(message: &str, id: &str) -> Option<String> {
    with_param(message, "requestId", id)
}

/// The text of each message of a JSON-RPC batch (a JSON array), as written; `None` when
/// `batch` is not a JSON array.
pub fn batch_texts(batch: &str) -> Option<Vec<&str>> {
    struct Items;
    impl<'de> Visitor<'de> for Items {
        type Value = Vec<&'de str>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element::<&'de RawValue>()? {
                items.push(item.get());
            }
            Ok(items)
        }
    }
    let mut de = serde_json::Deserializer::from_str(batch);
    let items = de.deserialize_seq(Items).ok()?;
    de.end().ok()?;
    Some(items)
}

/// The text of a request's `params.arguments`, as written (see [`member_text`]).
pub fn arguments_text(message: &str) -> Option<&str> {
    member_text(member_text(message, "params")?, "arguments")
}

/// What a `tools/call` is, as its key sees it: the tool and the texts, as written, of the
/// members that make one intention. Nothing else a call carries (`_meta`, the JSON-RPC
/// id, `progressToken`, [`TASK_PARAM`], members no revision defines) is part of it, so
/// nothing else can change whether or how the call is guarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall<'a> {
    /// `params.name`.
    pub tool: &'a str,
    /// `params.arguments` (`{}` when absent).
    pub arguments: Option<&'a str>,
    /// `params.inputResponses` of a multi-round-trip continuation (2026-07-28).
    pub input_responses: Option<&'a str>,
    /// `params.requestState` of a multi-round-trip continuation (2026-07-28).
    pub request_state: Option<&'a str>,
}

impl<'a> ToolCall<'a> {
    /// Reads a `tools/call` request: `message` parsed and `text` as written. `None` when
    /// it is not a `tools/call` with object `params` and a string `name`.
    pub fn read(message: &'a Value, text: &'a str) -> Option<ToolCall<'a>> {
        let request = as_request(message)?;
        if request.method != "tools/call" {
            return None;
        }
        let tool = request.params?.as_object()?.get("name")?.as_str()?;
        let params = member_text(text, "params")?;
        // A continuation member that is `null` continues nothing: the plain call.
        let present = |name| member_text(params, name).filter(|t| t.trim() != "null");
        Some(ToolCall {
            tool,
            arguments: member_text(params, "arguments"),
            input_responses: present("inputResponses"),
            request_state: present("requestState"),
        })
    }

    /// Whether the call continues a multi-round-trip exchange.
    pub fn is_continuation(&self) -> bool {
        self.input_responses.is_some() || self.request_state.is_some()
    }

    /// The call's fingerprint for `principal` on the endpoint `path` (see
    /// [`call_fingerprint`]). A continuation's `inputResponses` and `requestState` are
    /// part of it, each canonicalised as the arguments are: two identical continuations
    /// are one intention, and each round is an intention apart from the first. The
    /// arguments `ignore` points to (the key arguments the model fills in) do not count.
    pub fn fingerprint(&self, principal: &str, path: &str, ignore: &[String]) -> Fingerprint {
        self.fingerprint_of(principal, path, ignore, None)
    }

    /// [`ToolCall::fingerprint`], keyed by the arguments `intent` points to alone when it
    /// is set (`intent`: a reworded free-text argument is the same call).
    pub fn fingerprint_of(
        &self,
        principal: &str,
        path: &str,
        ignore: &[String],
        intent: Option<&[String]>,
    ) -> Fingerprint {
        if let (Some(fields), false) = (intent, self.is_continuation()) {
            return FingerprintBuilder::new(principal, "tools/call", path)
                .component(self.tool.as_bytes())
                .request_body_fields(
                    Some(b"application/json"),
                    self.arguments.unwrap_or("{}").as_bytes(),
                    fields,
                );
        }
        if !self.is_continuation() {
            return FingerprintBuilder::new(principal, "tools/call", path)
                .component(self.tool.as_bytes())
                .body(self.arguments.unwrap_or("{}").as_bytes(), ignore);
        }
        let part = |text: Option<&str>| -> Vec<u8> {
            match text {
                None => b"-".to_vec(),
                Some(t) => match oncely_core::canonical_json(t.as_bytes(), &[]) {
                    Some(canonical) => [b"J".as_slice(), &canonical].concat(),
                    None => [b"B".as_slice(), t.as_bytes()].concat(),
                },
            }
        };
        FingerprintBuilder::new(principal, "tools/call", path)
            .component(self.tool.as_bytes())
            .component(b"oncely/mrtr/v1")
            .component(&part(self.input_responses))
            .component(&part(self.request_state))
            .body(self.arguments.unwrap_or("{}").as_bytes(), ignore)
    }
}

/// The fingerprint of `principal`'s call of `tool` on the endpoint `path` with the
/// `arguments` text (`{}` when absent). The text is canonicalised by `oncely_core::canon`,
/// as HTTP bodies are: numbers that differ as decimals never share a fingerprint (a
/// parsed `serde_json::Value` would have rounded big integers and long decimals to one
/// double), numbers equal as decimals (`1.0`, `1`) do.
pub fn call_fingerprint(
    principal: &str,
    path: &str,
    tool: &str,
    arguments: Option<&str>,
) -> Fingerprint {
    FingerprintBuilder::new(principal, "tools/call", path)
        .component(tool.as_bytes())
        .body(arguments.unwrap_or("{}").as_bytes(), &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_argument_is_set_where_it_is_and_the_rest_kept_as_written() {
        let m = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","arguments":{"amount":100.10,"ref":{"nonce":"n","n":9007199254740993},"idempotency_key":"x"}}}"#;
        let top = with_argument(m, "/idempotency_key", r#""k""#).unwrap();
        assert!(top.contains(r#""idempotency_key":"k""#), "{top}");
        assert!(
            top.contains("100.10") && top.contains("9007199254740993"),
            "{top}"
        );
        let nested = with_argument(m, "/ref/nonce", r#""k""#).unwrap();
        assert!(nested.contains(r#""nonce":"k""#), "{nested}");
        assert!(with_argument(m, "/missing", r#""k""#).is_none());
        assert!(with_argument(m, "idempotency_key", r#""k""#).is_none());
    }

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
    fn arguments_are_read_as_written_and_the_key_changes_only_meta() {
        let msg = r#"{"id":1,"params":{"arguments":{"a":1},"name":"t","arguments" : {"n": 12345678901234567890123, "x":1.50}},"method":"tools/call"}"#;
        // The last of a repeated name, as serde_json's Value keeps it.
        assert_eq!(
            arguments_text(msg),
            Some(r#"{"n": 12345678901234567890123, "x":1.50}"#)
        );
        assert_eq!(arguments_text(r#"{"params":[1]}"#), None);
        assert_eq!(arguments_text("[1]"), None);
        let keyed = forwarded_call(msg, "k1").unwrap();
        assert_eq!(arguments_text(&keyed), arguments_text(msg));
        let v: Value = serde_json::from_str(&keyed).unwrap();
        assert_eq!(v["params"]["_meta"][IDEMPOTENCY_KEY_META], "k1");
        assert_eq!(v["method"], "tools/call");
        let with_meta = r#"{"params":{"_meta":{"a":1,"dev.oncely/idempotency-key":"old"}}}"#;
        let keyed = forwarded_call(with_meta, "new").unwrap();
        assert_eq!(
            keyed,
            r#"{"params":{"_meta":{"a":1,"dev.oncely/idempotency-key":"new"}}}"#
        );
        assert_eq!(forwarded_call(r#"{"params":1}"#, "k"), None);
        assert_eq!(
            batch_texts(r#"[ {"a": 1.0} , 2 ]"#),
            Some(vec![r#"{"a": 1.0}"#, "2"])
        );
        assert_eq!(batch_texts("{}"), None);
    }

    #[test]
    fn arguments_fingerprint_as_exact_decimals() {
        let fp = |a: &str| call_fingerprint("p", "/mcp", "t", Some(a));
        assert_ne!(
            fp(r#"{"id":123456789012345678901234567891}"#),
            fp(r#"{"id":123456789012345678901234567890}"#)
        );
        assert_ne!(fp(r#"{"x":0.10000000000000000001}"#), fp(r#"{"x":0.1}"#));
        assert_eq!(fp(r#"{"x":1.0,"y":1e2}"#), fp(r#"{ "y" : 100, "x" : 1 }"#));
        assert_eq!(call_fingerprint("p", "/mcp", "t", None), fp("{}"));
        assert_ne!(fp("{}"), call_fingerprint("p", "/mcp", "u", Some("{}")));
    }

    #[test]
    fn a_number_past_a_double_does_not_make_a_message_unreadable() {
        let msg =
            br#"{"id":1,"method":"tools/call","params":{"name":"t","arguments":{"x":1e400}}}"#;
        assert!(serde_json::from_slice::<Value>(msg).is_err());
        let v = parse(msg).unwrap();
        assert_eq!(as_request(&v).unwrap().method, "tools/call");
        assert_eq!(v["params"]["arguments"]["x"], "1e+400");
        let text = std::str::from_utf8(msg).unwrap();
        assert_eq!(arguments_text(text), Some(r#"{"x":1e400}"#));
        assert_ne!(
            call_fingerprint("p", "/mcp", "t", arguments_text(text)),
            call_fingerprint("p", "/mcp", "t", Some(r#"{"x":1e401}"#))
        );
        let keyed = forwarded_call(text, "k").unwrap();
        assert!(keyed.contains(r#""arguments":{"x":1e400}"#), "{keyed}");
        assert_eq!(
            batch_texts("[1e400, {\"a\":-1E-400}]"),
            Some(vec!["1e400", "{\"a\":-1E-400}"])
        );
        assert_eq!(parse(br#"{"a":"#), None);
        // Found by the jsonrpc fuzz target: the numbers serde_json can hold are read as it
        // reads them (`1.000` stays a float) beside one it cannot.
        assert_eq!(
            parse(br#"{"a":1.000,"b":1e400,"c":"1e400 \" 2e999","d":[-0,12]}"#),
            serde_json::from_str(r#"{"a":1.000,"b":"1e+400","c":"1e400 \" 2e999","d":[-0,12]}"#)
                .ok()
        );
        assert_eq!(
            parse(br#"{"a":1,"a":2}"#),
            Some(serde_json::json!({"a": 2}))
        );
    }

    #[test]
    fn nothing_but_name_arguments_and_a_continuation_keys_a_call() {
        let plain = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":1}}}"#;
        let key = |text: &str| {
            let v: Value = serde_json::from_str(text).unwrap();
            ToolCall::read(&v, text).map(|c| c.fingerprint("p", "/mcp", &[]))
        };
        let base = key(plain).unwrap();
        for extra in [
            r#""task":{"ttl":60000}"#,
            r#""_meta":{"progressToken":7,"io.modelcontextprotocol/clientCapabilities":{}}"#,
            r#""unknownMember":[1,2]"#,
            r#""task":null"#,
            r#""requestState":null,"inputResponses":null"#,
        ] {
            let text = plain.replace(r#""name":"t""#, &format!(r#""name":"t",{extra}"#));
            assert_eq!(key(&text), Some(base), "{text}");
        }
        let round = |responses: &str, state: &str| {
            plain.replace(
                r#""name":"t""#,
                &format!(r#""name":"t","inputResponses":{responses},"requestState":{state}"#),
            )
        };
        let first = key(&round(r#"{"n":{"action":"accept"}}"#, r#""s1""#)).unwrap();
        assert_ne!(first, base, "a continuation is its own intention");
        assert_eq!(
            key(&round(
                r#"{ "n" : { "action" : "accept" } }"#,
                r#""s\u0031""#
            )),
            Some(first),
            "the same continuation re-spelled"
        );
        assert_ne!(
            key(&round(r#"{"n":{"action":"decline"}}"#, r#""s1""#)),
            Some(first)
        );
        assert_ne!(
            key(&round(r#"{"n":{"action":"accept"}}"#, r#""s2""#)),
            Some(first)
        );
        assert_eq!(
            key(r#"{"id":1,"method":"tools/list","params":{"name":"t"}}"#),
            None
        );

        let forwarded = forwarded_call(
            &round("{}", r#""s""#).replace(r#""arguments""#, r#""task":{"ttl":1},"arguments""#),
            "k",
        )
        .unwrap();
        let v: Value = serde_json::from_str(&forwarded).unwrap();
        assert!(v["params"].get("task").is_none(), "{forwarded}");
        assert_eq!(v["params"]["_meta"][IDEMPOTENCY_KEY_META], "k");
        assert_eq!(v["params"]["requestState"], "s");
    }

    #[test]
    fn set_meta_keeps_other_meta_keys() {
        let mut r = json!({"content": [], "_meta": {"a": 1}});
        set_meta(&mut r, REPLAY_META_KEY, json!({"status": "replayed"}));
        assert_eq!(r["_meta"]["a"], 1);
        assert_eq!(r["_meta"][REPLAY_META_KEY]["status"], "replayed");
    }
}
