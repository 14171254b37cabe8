//! The OpenAPI reader: the operations of an OpenAPI 3.0 or 3.1 document, JSON or YAML,
//! each with the upstream its `servers` name when that is usable, and what it tells its
//! caller (summary, description, its `Idempotency-Key` header's description).

use std::path::Path;

use serde_json::Value;

use super::model::{Found, Said, Target};

/// The operations of one OpenAPI 3.x document.
pub(super) fn read_openapi(path: &Path) -> Result<Vec<Found>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let doc: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).map_err(|e| format!("not valid JSON: {e}"))?
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| format!("not valid YAML: {e}"))?
    };
    match doc.get("openapi").and_then(Value::as_str) {
        Some(v) if v.starts_with("3.") => {}
        Some(v) => return Err(format!("OpenAPI {v} is not supported (use 3.0 or 3.1)")),
        None if doc.get("swagger").is_some() => {
            return Err("Swagger 2.0 is not supported: convert it to OpenAPI 3".into())
        }
        None => return Err("not an OpenAPI document (no `openapi: 3.x`)".into()),
    }
    let server = |v: &Value| -> Option<String> {
        let url = v.get("servers")?.get(0)?.get("url")?.as_str()?;
        let usable = (url.starts_with("http://") || url.starts_with("https://"))
            && !url.contains('{')
            && crate::config::Upstream::parse(url).is_ok();
        usable.then(|| url.trim_end_matches('/').to_owned())
    };
    let doc_server = server(&doc);
    let mut out = Vec::new();
    let Some(paths) = doc.get("paths") else {
        return Ok(out);
    };
    let paths = paths
        .as_object()
        .ok_or("`paths` is not a map of paths to operations")?;
    for (p, item) in paths {
        if !p.starts_with('/') {
            return Err(format!("path {p:?} does not start with \"/\""));
        }
        let Some(item) = item.as_object() else {
            continue;
        };
        let path_server = server(&Value::Object(item.clone())).or_else(|| doc_server.clone());
        for m in [
            "get", "put", "post", "delete", "options", "head", "patch", "trace",
        ] {
            let Some(op) = item.get(m) else { continue };
            let text = |k: &str| op.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            let method = http::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .expect("a standard method");
            out.push(Found {
                source: path.display().to_string(),
                target: Target::Http {
                    method,
                    path: p.clone(),
                    server: server(op).or_else(|| path_server.clone()),
                },
                words: format!("{} {} {p}", text("operationId"), text("summary")),
                read_only_hint: false,
                destructive_hint: false,
                said: said(&doc, item, op),
                input_schema: None,
            });
        }
    }
    Ok(out)
}

/// What an operation tells its caller: its summary and description, and the
/// descriptions of its `Idempotency-Key` header parameter (its own or its path's, a
/// `$ref` into the document followed).
fn said(doc: &Value, item: &serde_json::Map<String, Value>, op: &Value) -> Vec<Said> {
    let mut out = Vec::new();
    for (k, at) in [
        ("summary", "the operation's summary"),
        ("description", "the operation's description"),
    ] {
        if let Some(text) = op.get(k).and_then(Value::as_str) {
            out.push(Said {
                at: at.into(),
                text: text.to_owned(),
                of_key: false,
            });
        }
    }
    let params = [op.get("parameters"), item.get("parameters")];
    let header = params
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(|p| resolve(doc, p))
        .find(|p| {
            p.get("in").and_then(Value::as_str) == Some("header")
                && p.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n.eq_ignore_ascii_case("idempotency-key"))
        });
    if let Some(p) = header {
        let schema = p.get("schema").and_then(|s| resolve(doc, s));
        for text in [
            p.get("description"),
            schema.and_then(|s| s.get("description")),
        ]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        {
            out.push(Said {
                at: "the description of its Idempotency-Key header".into(),
                text: text.to_owned(),
                of_key: true,
            });
        }
    }
    out
}

/// `value`, or what its `$ref` names in `doc` (a local reference, `#/...`).
fn resolve<'a>(doc: &'a Value, value: &'a Value) -> Option<&'a Value> {
    match value.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.pointer(r.strip_prefix('#')?),
        None => Some(value),
    }
}
