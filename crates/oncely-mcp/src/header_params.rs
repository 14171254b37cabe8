//! The tool parameters a server mirrors into HTTP headers (2026-07-28 Streamable HTTP,
//! "Custom Headers from Tool Parameters"): a property of a tool's `inputSchema` marked
//! `x-mcp-header: NAME` is carried, on every `tools/call` of that tool, in a
//! `Mcp-Param-{NAME}` header as well as in the body. Here: which parameters a schema
//! declares ([`declared`]), the value a header carries for an argument ([`encode`],
//! [`mirrored`]), and whether a header carries the body's value ([`decode`],
//! [`carries`]). The HTTP endpoint checks a call's headers with these; the remote link
//! writes them.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::Value;

/// The schema keyword that marks a parameter.
const KEYWORD: &str = "x-mcp-header";

/// The prefix and suffix of a Base64-encoded header value (`=?base64?…?=`).
const SENTINEL: (&str, &str) = ("=?base64?", "?=");

/// Deepest nesting of `properties` followed in a schema.
const MAX_DEPTH: usize = 32;

/// Schema keywords whose values are data, not schemas: never looked into.
const DATA_KEYWORDS: &[&str] = &["const", "default", "enum", "examples"];

/// One parameter a tool mirrors into a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderParam {
    /// The `x-mcp-header` value: the header is `Mcp-Param-{name}`.
    pub name: String,
    /// The chain of `properties` keys from the schema's root to the parameter.
    pub path: Vec<String>,
}

impl HeaderParam {
    /// The header's name, as written (`Mcp-Param-Region`).
    pub fn header(&self) -> String {
        format!("Mcp-Param-{}", self.name)
    }

    /// The parameter's value in a call's `arguments`: `None` when it is absent or `null`
    /// (then no header is sent, and none is expected).
    pub fn value_in<'a>(&self, arguments: Option<&'a Value>) -> Option<&'a Value> {
        let mut value = arguments?;
        for key in &self.path {
            value = value.get(key)?;
        }
        (!value.is_null()).then_some(value)
    }
}

/// The parameters `schema` (a tool's `inputSchema`) mirrors into headers, or why its
/// declarations are invalid (a tool definition the specification says clients exclude):
/// a name that is not an HTTP token, two names equal but for case, or a mark on a
/// property not reachable from the root through `properties` alone.
pub fn declared(schema: &Value) -> Result<Vec<HeaderParam>, String> {
    let mut found = Vec::new();
    walk(schema, Some(Vec::new()), &mut found, 0)?;
    for (i, p) in found.iter().enumerate() {
        if found[..i]
            .iter()
            .any(|q| q.name.eq_ignore_ascii_case(&p.name))
        {
            return Err(format!("{KEYWORD} {:?} is declared twice", p.name));
        }
    }
    Ok(found)
}

/// Looks for marks in `schema`; `path` is its chain of `properties` keys when it is
/// statically reachable, `None` when it is not.
fn walk(
    schema: &Value,
    path: Option<Vec<String>>,
    found: &mut Vec<HeaderParam>,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    match schema {
        Value::Object(map) => {
            if let Some(mark) = map.get(KEYWORD) {
                let name = mark
                    .as_str()
                    .filter(|n| is_token(n))
                    .ok_or_else(|| format!("{KEYWORD} {mark} is not an HTTP field name"))?;
                match &path {
                    Some(path) if !path.is_empty() => found.push(HeaderParam {
                        name: name.to_string(),
                        path: path.clone(),
                    }),
                    _ => {
                        return Err(format!(
                            "{KEYWORD} {name:?} marks a property not reachable through \
                             properties alone"
                        ))
                    }
                }
            }
            for (key, value) in map {
                if DATA_KEYWORDS.contains(&key.as_str()) {
                    continue;
                }
                match (key.as_str(), value.as_object(), &path) {
                    ("properties", Some(properties), Some(path)) => {
                        for (name, property) in properties {
                            let mut chain = path.clone();
                            chain.push(name.clone());
                            walk(property, Some(chain), found, depth + 1)?;
                        }
                    }
                    ("properties", Some(properties), None) => {
                        for property in properties.values() {
                            walk(property, None, found, depth + 1)?;
                        }
                    }
                    _ => walk(value, None, found, depth + 1)?,
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                walk(item, None, found, depth + 1)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Whether `name` is an HTTP field name (RFC 9110 `token`).
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The header value for `text`: as it is when it is plain visible ASCII (spaces inside
/// allowed) and not itself of the sentinel's shape, else Base64 in the sentinel.
pub fn encode(text: &str) -> String {
    let visible = text.bytes().all(|b| b == b' ' || b.is_ascii_graphic());
    let padded = text.starts_with(' ') || text.ends_with(' ');
    let sentinel_shaped = text.starts_with(SENTINEL.0) && text.ends_with(SENTINEL.1);
    if visible && !padded && !sentinel_shaped {
        text.to_string()
    } else {
        format!("{}{}{}", SENTINEL.0, STANDARD.encode(text), SENTINEL.1)
    }
}

/// The text a header value carries: a sentinel's Base64 decoded (`None` when it is not
/// Base64 of UTF-8), a plain value as it is (`None` when it holds bytes a header value
/// may not: anything but visible ASCII, space and tab).
pub fn decode(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    if !text
        .bytes()
        .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
    {
        return None;
    }
    let inner = text
        .strip_prefix(SENTINEL.0)
        .and_then(|t| t.strip_suffix(SENTINEL.1));
    match inner {
        Some(encoded) => String::from_utf8(STANDARD.decode(encoded).ok()?).ok(),
        None => Some(text.to_string()),
    }
}

/// The text an argument's value is carried as: a string as it is, a number in decimal, a
/// boolean as `true` or `false`; `None` for anything else.
fn as_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Whether a header's (decoded) `text` carries the argument `value`: a string exactly, a
/// boolean as `true`/`false`, a number numerically (`42.0` carries `42`).
pub fn carries(text: &str, value: &Value) -> bool {
    match value {
        Value::Number(want) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Number(got)) => match (got.as_i64(), want.as_i64()) {
                (Some(a), Some(b)) => a == b,
                _ => got.as_f64().is_some() && got.as_f64() == want.as_f64(),
            },
            _ => false,
        },
        Value::String(_) | Value::Bool(_) => as_text(value).is_some_and(|t| t == text),
        _ => false,
    }
}

/// The `Mcp-Param-*` headers a call with `arguments` carries for `params`: each
/// parameter with a value, its value encoded.
pub fn mirrored(params: &[HeaderParam], arguments: Option<&Value>) -> Vec<(String, String)> {
    params
        .iter()
        .filter_map(|p| {
            let text = as_text(p.value_in(arguments)?)?;
            Some((p.header(), encode(&text)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(name: &str, path: &[&str]) -> HeaderParam {
        HeaderParam {
            name: name.into(),
            path: path.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn declarations_are_read_through_properties_alone() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "query": {"type": "string"},
            "target": {"type": "object", "properties": {
                "shard": {"type": "integer", "x-mcp-header": "Shard"}}},
            "example": {"type": "string", "default": {"x-mcp-header": "NotOne"}}}});
        let mut found = declared(&schema).unwrap();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(
            found,
            vec![
                param("Region", &["region"]),
                param("Shard", &["target", "shard"])
            ]
        );
        assert_eq!(declared(&json!({"type": "object"})).unwrap(), vec![]);
    }

    #[test]
    fn invalid_declarations_are_named() {
        for (schema, why) in [
            (
                json!({"properties": {"a": {"x-mcp-header": "A"}, "b": {"x-mcp-header": "a"}}}),
                "twice",
            ),
            (
                json!({"properties": {"a": {"x-mcp-header": "Bad Name"}}}),
                "field name",
            ),
            (
                json!({"properties": {"a": {"x-mcp-header": ""}}}),
                "field name",
            ),
            (
                json!({"properties": {"list": {"items": {"x-mcp-header": "Item"}}}}),
                "reachable",
            ),
            (
                json!({"oneOf": [{"properties": {"a": {"x-mcp-header": "A"}}}]}),
                "reachable",
            ),
            (json!({"x-mcp-header": "Root"}), "reachable"),
        ] {
            let err = declared(&schema).unwrap_err();
            assert!(err.contains(why), "{schema}: {err}");
        }
    }

    #[test]
    fn values_are_encoded_as_the_specification_shows() {
        assert_eq!(encode("us-west1"), "us-west1");
        assert_eq!(encode("Hello, 世界"), "=?base64?SGVsbG8sIOS4lueVjA==?=");
        assert_eq!(encode(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(encode("line1\nline2"), "=?base64?bGluZTEKbGluZTI=?=");
        assert_eq!(
            encode("=?base64?literal?="),
            "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
        );
        for text in [
            "us-west1",
            "Hello, 世界",
            " padded ",
            "line1\nline2",
            "=?base64?x?=",
        ] {
            assert_eq!(decode(encode(text).as_bytes()).as_deref(), Some(text));
        }
        assert_eq!(decode(b"=?base64?not base64!?="), None);
        assert_eq!(
            decode(b"caf\xc3\xa9"),
            None,
            "raw UTF-8 is not a header value"
        );
        assert_eq!(decode(b"a\x01b"), None);
    }

    #[test]
    fn headers_carry_values_by_their_type() {
        assert!(carries("us-west1", &json!("us-west1")));
        assert!(!carries("us-west2", &json!("us-west1")));
        assert!(carries("42", &json!(42)));
        assert!(carries("42.0", &json!(42)), "integers compare as numbers");
        assert!(carries("-7", &json!(-7)));
        assert!(!carries("43", &json!(42)));
        assert!(!carries("forty-two", &json!(42)));
        assert!(carries("true", &json!(true)));
        assert!(!carries("True", &json!(true)));
        assert!(!carries("1", &json!(true)));
        assert!(!carries("{}", &json!({})));
    }

    #[test]
    fn a_call_mirrors_each_value_it_carries() {
        let params = [
            param("Region", &["region"]),
            param("Shard", &["target", "shard"]),
            param("Dry", &["dry"]),
            param("Note", &["note"]),
        ];
        let args = json!({"region": "eu", "target": {"shard": 3}, "dry": null});
        assert_eq!(
            mirrored(&params, Some(&args)),
            vec![
                ("Mcp-Param-Region".to_string(), "eu".to_string()),
                ("Mcp-Param-Shard".to_string(), "3".to_string())
            ]
        );
        assert!(mirrored(&params, None).is_empty());
    }
}
