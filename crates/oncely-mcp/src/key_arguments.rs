//! The arguments of a `tools/call` that are idempotency keys the model fills in (a
//! payment tool's `idempotency_key`, AWS's `ClientToken`): a model told to send a unique
//! key with every call makes one up on each attempt, so such an argument is not part of
//! the call's intention. It is left out of the call's key, and the server receives in it
//! a key derived from the record (the same on every attempt of one call) instead of the
//! model's, in the UUID layout unless the argument's schema rules that out.
//!
//! Which arguments: by default every top-level argument whose name, lower-cased and
//! without `_` and `-`, is one of [`DEFAULT_NAMES`]; `key_arguments` (`TOOL:/POINTER`,
//! `*` in TOOL matching any run of characters) names more, and `key_arguments = []`
//! turns the default off.

use serde_json::Value;

use crate::tool_patterns::any_matches;

/// The names (lower-cased, without `_` and `-`) of the arguments that are keys by default.
pub const DEFAULT_NAMES: &[&str] = &[
    "idempotencykey",
    "idempotencytoken",
    "clienttoken",
    "clientrequestid",
    "requestid",
    "dedupekey",
    "deduplicationid",
];

/// Which arguments of a call are idempotency keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyArguments {
    /// The [`DEFAULT_NAMES`] count.
    defaults: bool,
    /// More: (tool pattern, JSON pointer into `arguments`).
    named: Vec<(String, String)>,
}

impl Default for KeyArguments {
    /// The default names, nothing more.
    fn default() -> KeyArguments {
        KeyArguments {
            defaults: true,
            named: Vec::new(),
        }
    }
}

impl KeyArguments {
    /// The setting `key_arguments` (or `--key-argument`) gives: `[]` turns the default
    /// off; each entry `TOOL:/POINTER` names one more. An entry that is not that is the
    /// error, naming its index.
    pub fn parse(entries: &[String]) -> Result<KeyArguments, (usize, String)> {
        let mut named = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let Some((tool, pointer)) = entry.split_once(":/") else {
                return Err((
                    i,
                    format!(
                        "{entry:?} is not TOOL:/POINTER (e.g. \"create_payment:/idempotency_key\")"
                    ),
                ));
            };
            if tool.is_empty() {
                return Err((i, format!("{entry:?} names no tool")));
            }
            named.push((tool.to_string(), format!("/{pointer}")));
        }
        Ok(KeyArguments {
            defaults: !entries.is_empty(),
            named,
        })
    }

    /// Whether `name` is a key argument's by default.
    pub fn is_default_name(name: &str) -> bool {
        let folded = || {
            name.bytes()
                .filter(|b| *b != b'_' && *b != b'-')
                .map(|b| b.to_ascii_lowercase())
        };
        DEFAULT_NAMES.iter().any(|d| folded().eq(d.bytes()))
    }

    /// The JSON pointers of `tool`'s key arguments that `arguments` holds, in order.
    pub fn of(&self, tool: &str, arguments: &Value) -> Vec<String> {
        let mut found = Vec::new();
        if self.defaults {
            if let Some(obj) = arguments.as_object() {
                for name in obj.keys().filter(|n| KeyArguments::is_default_name(n)) {
                    found.push(format!("/{}", name.replace('~', "~0").replace('/', "~1")));
                }
            }
        }
        for (pattern, pointer) in &self.named {
            let matches = any_matches(std::slice::from_ref(pattern), tool);
            if matches && arguments.pointer(pointer).is_some() && !found.contains(pointer) {
                found.push(pointer.clone());
            }
        }
        found
    }
}

/// The schema of the property `pointer` names in an `inputSchema`
/// (`/a/b` is `properties.a.properties.b`).
pub fn property<'a>(input_schema: &'a Value, pointer: &str) -> Option<&'a Value> {
    let mut at = input_schema;
    for token in pointer.strip_prefix('/')?.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        at = at.get("properties")?.get(token.as_str())?;
    }
    Some(at)
}

/// A key in the UUID layout, to test a schema with.
const SAMPLE_UUID: &str = "0192f0c1-2b3c-8d4e-9f50-6a7b8c9d0e1f";

/// Whether a property's schema admits a UUID string: a `type` that allows strings, no
/// `format` but `uuid`, a `pattern` a UUID matches, a `maxLength` of 36 or more.
pub fn admits_uuid(schema: &Value) -> bool {
    let types_ok = match schema.get("type") {
        None => true,
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        Some(_) => false,
    };
    let format_ok = schema
        .get("format")
        .and_then(Value::as_str)
        .is_none_or(|f| f == "uuid");
    let pattern_ok = match schema.get("pattern").and_then(Value::as_str) {
        None => true,
        Some(p) => regex::Regex::new(p).is_ok_and(|r| r.is_match(SAMPLE_UUID)),
    };
    let length_ok = schema
        .get("maxLength")
        .and_then(Value::as_u64)
        .is_none_or(|n| n >= SAMPLE_UUID.len() as u64)
        && schema
            .get("minLength")
            .and_then(Value::as_u64)
            .is_none_or(|n| n <= SAMPLE_UUID.len() as u64);
    types_ok && format_ok && pattern_ok && length_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_default_names_are_folded() {
        for name in [
            "idempotency_key",
            "IdempotencyKey",
            "client-token",
            "ClientToken",
            "request_id",
            "dedupe_key",
            "deduplication_id",
            "idempotency_token",
            "clientRequestId",
        ] {
            assert!(KeyArguments::is_default_name(name), "{name}");
        }
        for name in ["key", "token", "amount", "idempotency", "request"] {
            assert!(!KeyArguments::is_default_name(name), "{name}");
        }
    }

    #[test]
    fn the_key_arguments_of_a_call() {
        let args = json!({"amount": 100, "idempotency_key": "u-1", "ref": {"nonce": "n"}});
        let default = KeyArguments::default();
        assert_eq!(default.of("pay", &args), ["/idempotency_key"]);
        let more = KeyArguments::parse(&["pay:/ref/nonce".into(), "other:/amount".into()]).unwrap();
        assert_eq!(more.of("pay", &args), ["/idempotency_key", "/ref/nonce"]);
        let off = KeyArguments::parse(&[]).unwrap();
        assert!(off.of("pay", &args).is_empty());
        assert!(KeyArguments::parse(&["pay/idempotency_key".into()]).is_err());
        assert!(KeyArguments::parse(&[":/x".into()]).is_err());
        let wild = KeyArguments::parse(&["create_*:/ref/nonce".into()]).unwrap();
        assert_eq!(
            wild.of("create_payment", &args),
            ["/idempotency_key", "/ref/nonce"]
        );
        let schema = json!({"properties": {"idempotency_key": {"type": "string"},
            "ref": {"properties": {"nonce": {"type": "string", "maxLength": 8}}}}});
        assert_eq!(property(&schema, "/ref/nonce").unwrap()["maxLength"], 8);
        assert!(property(&schema, "/ref/other").is_none());
    }

    #[test]
    fn a_schema_admits_a_uuid_unless_it_rules_it_out() {
        assert!(admits_uuid(&json!({"type": "string"})));
        assert!(admits_uuid(&json!({"type": "string", "format": "uuid"})));
        assert!(admits_uuid(&json!({"type": "string", "maxLength": 45})));
        assert!(admits_uuid(
            &json!({"type": "string", "pattern": "^[0-9a-f-]+$"})
        ));
        assert!(!admits_uuid(&json!({"type": "string", "maxLength": 16})));
        assert!(!admits_uuid(
            &json!({"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"})
        ));
        assert!(!admits_uuid(
            &json!({"type": "string", "format": "date-time"})
        ));
        assert!(!admits_uuid(&json!({"type": "integer"})));
    }
}
