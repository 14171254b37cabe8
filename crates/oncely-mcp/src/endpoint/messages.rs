//! The endpoint for transports that carry JSON-RPC messages themselves (stdio): one
//! message in, with what its transport knows of it ([`MessageContext`]), the messages to send
//! back out. Nothing here guards anything: the message takes the one path every HTTP
//! request takes (`transport::handle`: cancellations, the tasks extension, a guarded
//! call through the engine, everything else forwarded), as a request whose head says
//! what the transport knows (its session, its principal, its protocol revision and, in
//! the stateless era, the routing headers read from the message itself, so that they
//! always match it). Its answer is read back as messages; an HTTP-only answer (a
//! problem) becomes the JSON-RPC error of the request it answers.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

use super::headers::{header_str, is_modern};
use super::response::messages_in;
use super::McpEndpoint;
use crate::config::PRINCIPAL_HEADER;
use crate::jsonrpc;
use crate::jsonrpc::code;

/// What a message transport knows of a message besides its bytes.
#[derive(Debug, Clone)]
pub struct MessageContext {
    /// The client's session: cancellations and the guarded calls in flight are its own.
    pub session: String,
    /// Who the client is (hashed before it reaches the ledger).
    pub principal: String,
    /// The protocol revision the session negotiated, once it has.
    pub revision: Option<String>,
}

impl McpEndpoint {
    /// Answers one JSON-RPC message (or batch) of a message transport: the messages to
    /// send back, in order (none for a notification, a response, or a request its client
    /// cancelled). A guarded `tools/call` is guarded exactly as on HTTP.
    pub async fn exchange(&self, message: Bytes, context: &MessageContext) -> Vec<Value> {
        let parsed = jsonrpc::parse(&message);
        let req = request(self.path(), message, parsed.as_ref(), context);
        let resp = self.handle(req).await;
        let (parts, body) = resp.into_parts();
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                tracing::warn!(route = %self.path(), error = %e, "the answer broke off");
                let error = json!({"code": code::INTERNAL_ERROR, "message": "the MCP server's answer broke off"});
                return error_for(parsed.as_ref(), error);
            }
        };
        let problem = header_str(&parts.headers, "content-type")
            .is_some_and(|c| c.starts_with("application/problem+json"));
        if problem {
            let problem: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let detail = problem
                .get("detail")
                .and_then(Value::as_str)
                .unwrap_or("oncely could not answer this request");
            let code = problem.get("code").and_then(Value::as_str).unwrap_or("");
            let error = json!({"code": code::INTERNAL_ERROR, "message": format!("{detail} ({code})"),
                "data": {"oncely": code, "status": parts.status.as_u16()}});
            return error_for(parsed.as_ref(), error);
        }
        let messages = messages_in(&parts.headers, &bytes);
        // A batch is answered with one batch (JSON-RPC), not its answers one by one.
        if parsed.as_ref().is_some_and(Value::is_array) && messages.len() > 1 {
            return vec![Value::Array(messages)];
        }
        messages
    }
}

/// The request `message` is handled as.
fn request(
    path: &str,
    message: Bytes,
    parsed: Option<&Value>,
    context: &MessageContext,
) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(message));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = path.parse().unwrap_or_default();
    let headers = req.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    put(headers, "mcp-session-id", &context.session);
    put(headers, PRINCIPAL_HEADER, &context.principal);
    // The revision this message says it is of (the stateless era names it in each
    // message), else the session's.
    let named = parsed
        .and_then(|m| m.pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion"))
        .and_then(Value::as_str);
    if let Some(revision) = named.or(context.revision.as_deref()) {
        put(headers, "mcp-protocol-version", revision);
    }
    if is_modern(headers) {
        // The stateless era's routing headers, read from the message: they match it.
        if let Some(m) = parsed {
            let method = m.get("method").and_then(Value::as_str).unwrap_or("");
            let name = m
                .pointer("/params/name")
                .or_else(|| m.pointer("/params/taskId"))
                .and_then(Value::as_str);
            put(headers, "mcp-method", method);
            if let Some(name) = name {
                put(headers, "mcp-name", name);
            }
        }
    }
    req
}

/// Sets the header `name` to `value` (left out when `value` cannot be a header value).
fn put(headers: &mut http::HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// The response carrying `error` to `message`, when it is a request.
fn error_for(message: Option<&Value>, error: Value) -> Vec<Value> {
    message
        .and_then(jsonrpc::as_request)
        .map(|request| jsonrpc::error_value(request.id, error))
        .into_iter()
        .collect()
}
