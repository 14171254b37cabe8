//! What the HTTP transport reads of a request's headers: its protocol era
//! (`MCP-Protocol-Version`) and, in the stateless era (2026-07-28), whether its routing
//! headers (`Mcp-Method`, `Mcp-Name`) and a tool's parameter headers (`Mcp-Param-*`)
//! match its body.

use http::header::{HeaderMap, HeaderName};
use serde_json::Value;

use crate::core::{is_stateless, HANDSHAKE_VERSIONS};
use crate::header_params::{carries, decode, HeaderParam};

/// Where a request's `Mcp-Name` is in its body: a tool's name.
pub(super) const NAME: (&str, &str) = ("/params/name", "tool name");

/// Where a request's `Mcp-Name` is in its body: a task's id.
pub(super) const TASK_ID: (&str, &str) = ("/params/taskId", "taskId");

/// Whether a request is of the stateless era (2026-07-28 or later): its
/// `MCP-Protocol-Version` names a revision without the initialize handshake.
pub(super) fn is_modern(headers: &HeaderMap) -> bool {
    header_str(headers, "mcp-protocol-version").is_some_and(is_stateless)
}

/// For the stateless era: the routing headers of a request must match its body
/// (`Mcp-Method` its method, `Mcp-Name` the member `name` points to, and the
/// `MCP-Protocol-Version` its `_meta` protocol version).
pub(super) fn header_mismatch(
    headers: &HeaderMap,
    message: &Value,
    name: (&str, &str),
) -> Option<String> {
    let version = header_str(headers, "mcp-protocol-version")?;
    if HANDSHAKE_VERSIONS.contains(&version) {
        return None;
    }
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let (pointer, name_what) = name;
    let name = message
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("");
    let check = |header: &str, what: &str, want: &str| {
        // `Mcp-Name` may carry its value in the Base64 sentinel; `Mcp-Method` may not.
        let got = headers
            .get(header.to_ascii_lowercase())
            .map(|v| match header {
                "Mcp-Name" => decode(v.as_bytes()),
                _ => v.to_str().ok().map(str::to_string),
            });
        match got {
            Some(Some(got)) if got == want => None,
            Some(None) => Some(format!(
                "{header} header holds characters a header value may not carry, or a \
                 sentinel that is not Base64"
            )),
            Some(_) => Some(format!(
                "{header} header does not match the body's {what} {want:?}"
            )),
            None => Some(format!(
                "{header} header is missing: protocol {version} needs it \
                 (the body's {what} is {want:?})"
            )),
        }
    };
    if let Some(problem) = check("Mcp-Method", "method", method) {
        return Some(problem);
    }
    if let Some(problem) = check("Mcp-Name", name_what, name) {
        return Some(problem);
    }
    if let Some(v) = message
        .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
        .and_then(Value::as_str)
    {
        if v != version {
            return Some("MCP-Protocol-Version header does not match _meta protocolVersion".into());
        }
    }
    None
}

/// For a `tools/call` of a tool whose schema marks parameters (`params`): each
/// `Mcp-Param-{Name}` header must carry its argument (decoded, compared by the argument's
/// type), a marked argument with a value needs its header, and a header needs its value
/// ("Server Behavior for Custom Headers"). The first that does not, named.
pub(super) fn param_mismatch(
    headers: &HeaderMap,
    message: &Value,
    params: &[HeaderParam],
) -> Option<String> {
    let arguments = message.pointer("/params/arguments");
    for param in params {
        let header = param.header();
        let Ok(name) = HeaderName::from_bytes(header.to_ascii_lowercase().as_bytes()) else {
            continue;
        };
        let given: Vec<_> = headers.get_all(&name).iter().collect();
        let value = param.value_in(arguments);
        let argument = param.path.join(".");
        let problem = match (given.as_slice(), value) {
            ([], None) => continue,
            ([], Some(value)) => format!(
                "{header} header is missing: the tool mirrors argument {argument} into it \
                 and the body's is {value}"
            ),
            ([_, _, ..], _) => format!("{header} header is given more than once"),
            ([one], value) => match (decode(one.as_bytes()), value) {
                (None, _) => format!(
                    "{header} header holds characters a header value may not carry, or a \
                     sentinel that is not Base64"
                ),
                (Some(_), None) => {
                    format!("{header} header is given but the body has no argument {argument}")
                }
                (Some(text), Some(value)) if !carries(&text, value) => {
                    format!("{header} header does not match the body's argument {argument} {value}")
                }
                (Some(_), Some(_)) => continue,
            },
        };
        return Some(problem);
    }
    None
}

/// The header `name` as text, when it is present and readable.
pub(super) fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderValue;
    use serde_json::json;

    #[test]
    fn stateless_era_headers_must_match_the_body() {
        let msg = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"render","arguments":{},
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}});
        let mut h = HeaderMap::new();
        assert_eq!(
            header_mismatch(&h, &msg, NAME),
            None,
            "no version header: handshake era"
        );
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-06-18"),
        );
        assert_eq!(header_mismatch(&h, &msg, NAME), None);
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2026-07-28"),
        );
        h.insert("mcp-method", HeaderValue::from_static("tools/call"));
        h.insert("mcp-name", HeaderValue::from_static("other"));
        assert!(header_mismatch(&h, &msg, NAME)
            .unwrap()
            .contains("Mcp-Name"));
        h.insert("mcp-name", HeaderValue::from_static("render"));
        assert_eq!(header_mismatch(&h, &msg, NAME), None);
        h.insert("mcp-method", HeaderValue::from_static("tools/list"));
        let wrong = header_mismatch(&h, &msg, NAME).unwrap();
        assert!(
            wrong.contains("Mcp-Method header does not match"),
            "{wrong}"
        );
        // A missing header is named as missing, not as one that disagrees.
        h.remove("mcp-method");
        let missing = header_mismatch(&h, &msg, NAME).unwrap();
        assert!(
            missing.contains("Mcp-Method header is missing"),
            "{missing}"
        );
        h.insert("mcp-method", HeaderValue::from_static("tools/call"));
        h.remove("mcp-name");
        let missing = header_mismatch(&h, &msg, NAME).unwrap();
        assert!(missing.contains("Mcp-Name header is missing"), "{missing}");
    }
}
