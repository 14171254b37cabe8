//! The MCP client: the tools of an MCP server and their annotations, read over
//! Streamable HTTP (`initialize`, `notifications/initialized`, every page of
//! `tools/list`), with JSON or event-stream answers.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use oncely_core::units::format_duration;
use oncely_http::client::error_chain;
use serde_json::{json, Value};

use super::model::{Found, Target};

/// How long one MCP request may take.
const MCP_TIMEOUT: Duration = Duration::from_secs(10);

/// The protocol version the inventory asks an MCP server for.
const MCP_PROTOCOL: &str = "2025-11-25";

/// The tools of one MCP server: initialize, notifications/initialized, then tools/list
/// (every page), over Streamable HTTP with JSON or event-stream answers.
pub(super) async fn list_tools(url: &str) -> Result<Vec<Found>, String> {
    let uri: http::Uri = url.parse().map_err(|_| "not a URL".to_owned())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err("not an http:// or https:// URL".into());
    }
    let client = oncely_http::client::upstream_client_or_warn(&Default::default());
    let mut session = McpSession {
        client,
        url: url.to_owned(),
        id: None,
        protocol: None,
    };
    let init = session
        .request(
            1,
            "initialize",
            json!({
                "protocolVersion": MCP_PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "oncely-inventory", "version": env!("CARGO_PKG_VERSION")},
            }),
        )
        .await?;
    session.protocol = init
        .get("protocolVersion")
        .and_then(Value::as_str)
        .map(str::to_owned);
    session
        .notify("notifications/initialized", json!({}))
        .await?;
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0..100 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let result = session.request(2 + page, "tools/list", params).await?;
        let list = result
            .get("tools")
            .and_then(Value::as_array)
            .ok_or("tools/list answered without a `tools` list")?;
        for t in list {
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                continue;
            };
            let hint = |h: &str| {
                t.pointer(&format!("/annotations/{h}"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            };
            tools.push(Found {
                source: url.to_owned(),
                target: Target::Tool {
                    name: name.to_owned(),
                },
                words: format!(
                    "{name} {}",
                    t.pointer("/annotations/title")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                ),
                read_only_hint: hint("readOnlyHint"),
                destructive_hint: hint("destructiveHint"),
            });
        }
        cursor = result
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    session.end().await;
    Ok(tools)
}

/// One MCP session, as a client.
struct McpSession {
    client: oncely_http::client::PooledClient<Full<Bytes>>,
    url: String,
    id: Option<String>,
    protocol: Option<String>,
}

impl McpSession {
    fn post(&self, message: &Value) -> http::Request<Full<Bytes>> {
        let mut req = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(id) = &self.id {
            req = req.header("mcp-session-id", id);
        }
        if let Some(p) = &self.protocol {
            req = req.header("mcp-protocol-version", p);
        }
        req.body(Full::new(Bytes::from(message.to_string())))
            .expect("a valid request")
    }

    /// Sends a request and returns its result (an error answer is an error).
    async fn request(&mut self, id: i64, method: &str, params: Value) -> Result<Value, String> {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let req = self.post(&message);
        let answer = tokio::time::timeout(MCP_TIMEOUT, async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("unreachable: {}", error_chain(&e)))?;
            if !resp.status().is_success() {
                return Err(format!("{method}: HTTP {}", resp.status()));
            }
            if let Some(s) = resp.headers().get("mcp-session-id") {
                if let Ok(s) = s.to_str() {
                    self.id = Some(s.to_owned());
                }
            }
            let sse = resp
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let mut body = resp.into_body();
            if sse {
                // The stream may stay open after the answer: stop at the answer.
                let mut parser = oncely_mcp::sse::Parser::new(16 << 20);
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(|e| format!("{method}: {e}"))?;
                    let Some(chunk) = frame.data_ref() else {
                        continue;
                    };
                    for event in parser.feed(chunk) {
                        if let Ok(v) = serde_json::from_str::<Value>(&event.data) {
                            if v.get("id") == Some(&json!(id)) {
                                return Ok(v);
                            }
                        }
                    }
                }
                Err(format!(
                    "{method}: the event stream ended without an answer"
                ))
            } else {
                let bytes = body
                    .collect()
                    .await
                    .map_err(|e| format!("{method}: {e}"))?
                    .to_bytes();
                serde_json::from_slice::<Value>(&bytes)
                    .map_err(|e| format!("{method}: the answer is not JSON: {e}"))
            }
        })
        .await
        .map_err(|_| {
            format!(
                "{method}: no answer within {}",
                format_duration(MCP_TIMEOUT)
            )
        })??;
        if let Some(e) = answer.get("error") {
            return Err(format!(
                "{method}: error {}: {}",
                e.get("code").unwrap_or(&Value::Null),
                e.get("message").and_then(Value::as_str).unwrap_or("")
            ));
        }
        answer
            .get("result")
            .cloned()
            .ok_or_else(|| format!("{method}: the answer has no result"))
    }

    async fn notify(&mut self, method: &str, params: Value) -> Result<(), String> {
        let req = self.post(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
        let resp = tokio::time::timeout(MCP_TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| format!("{method}: no answer"))?
            .map_err(|e| format!("unreachable: {}", error_chain(&e)))?;
        if !resp.status().is_success() {
            return Err(format!("{method}: HTTP {}", resp.status()));
        }
        Ok(())
    }

    /// Ends the session (best effort: a server may not support it).
    async fn end(&self) {
        let Some(id) = &self.id else { return };
        let Ok(req) = http::Request::delete(&self.url)
            .header("mcp-session-id", id)
            .body(Full::new(Bytes::new()))
        else {
            return;
        };
        let _ = tokio::time::timeout(MCP_TIMEOUT, self.client.request(req)).await;
    }
}
