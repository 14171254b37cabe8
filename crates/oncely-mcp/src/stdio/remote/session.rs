//! What a remote link keeps of its server between requests ([`Session`]): where it is and
//! the headers every request carries ([`Remote`]), the `Mcp-Session-Id` the server gave,
//! the negotiated revision, the client's `initialize` (to start a new session with) and
//! the parameters each tool mirrors into headers; and the HTTP request a message becomes
//! with them.

use std::sync::Mutex;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, Request, Uri};
use oncely_tower::BoxBody;
use serde_json::Value;

use crate::body::full;
use crate::catalog::ToolCatalog;
use crate::core::is_stateless;
use crate::header_params::{encode, mirrored};
use crate::jsonrpc;

/// The remote server: its URL and the headers every request to it carries.
#[derive(Clone)]
pub struct Remote {
    /// The server's Streamable HTTP endpoint (`http://` or `https://`).
    pub url: Uri,
    /// Sent with every request (e.g. `Authorization`); their values are never logged.
    pub headers: HeaderMap,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("headers", &names)
            .finish()
    }
}

/// A remote server and what the link learnt of it.
pub(super) struct Session {
    remote: Remote,
    /// The server's `Mcp-Session-Id`, once `initialize` was answered with one.
    id: Mutex<Option<HeaderValue>>,
    /// The negotiated protocol revision, once `initialize` was answered.
    revision: Mutex<Option<String>>,
    /// The client's `initialize`, to start a new session with when the server forgot
    /// its one.
    initialize: Mutex<Option<String>>,
    /// The server's tools as its `tools/list` answers named them: the parameters each
    /// mirrors into `Mcp-Param-*` headers.
    tools: ToolCatalog,
}

impl Session {
    pub(super) fn new(remote: Remote) -> Session {
        Session {
            remote,
            id: Mutex::new(None),
            revision: Mutex::new(None),
            initialize: Mutex::new(None),
            tools: ToolCatalog::new(),
        }
    }

    /// Learns the tools a `tools/list` response names.
    pub(super) fn learn_tools(&self, response: &[u8]) {
        let value: Option<Value> = jsonrpc::parse(response);
        if let Some(result) = value.as_ref().and_then(|v| v.get("result")) {
            self.tools.observe_list(result);
        }
    }

    /// The server's session id, once it gave one.
    pub(super) fn id(&self) -> Option<HeaderValue> {
        lock(&self.id).clone()
    }

    pub(super) fn set_id(&self, id: Option<HeaderValue>) {
        *lock(&self.id) = id;
    }

    /// Keeps the client's `initialize` message.
    pub(super) fn keep_initialize(&self, text: &str) {
        *lock(&self.initialize) = Some(text.to_owned());
    }

    /// The client's `initialize` message, once it sent one.
    pub(super) fn initialize(&self) -> Option<String> {
        lock(&self.initialize).clone()
    }

    /// Keeps the revision `initialize` was answered with.
    pub(super) fn learn_revision(&self, response: &[u8]) {
        let value: Option<Value> = jsonrpc::parse(response);
        let revision = value
            .as_ref()
            .and_then(|v| v.pointer("/result/protocolVersion"))
            .and_then(Value::as_str);
        if let Some(revision) = revision {
            *lock(&self.revision) = Some(revision.to_owned());
        }
    }

    /// The request to the server with `body`: the remote's headers, the session, the
    /// revision and, in the stateless era, the routing headers `message` implies
    /// (`Mcp-Method`, `Mcp-Name`, and for a `tools/call` the `Mcp-Param-*` headers of the
    /// arguments its tool's schema marks), each value encoded as the transport says.
    pub(super) fn request(
        &self,
        method: Method,
        body: Bytes,
        message: Option<&Value>,
    ) -> Request<BoxBody> {
        let mut headers = self.remote.headers.clone();
        if method == Method::POST {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if let Some(session) = self.id() {
            headers.insert("mcp-session-id", session);
        }
        let named = message
            .and_then(|m| m.pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let revision = named.or_else(|| lock(&self.revision).clone());
        if let Some(revision) = &revision {
            put(&mut headers, "mcp-protocol-version", revision);
        }
        if let (Some(m), true) = (message, revision.as_deref().is_some_and(is_stateless)) {
            if let Some(method) = m.get("method").and_then(Value::as_str) {
                put(&mut headers, "mcp-method", method);
            }
            let name = ["/params/name", "/params/taskId", "/params/uri"]
                .iter()
                .find_map(|p| m.pointer(p).and_then(Value::as_str));
            if let Some(name) = name {
                put(&mut headers, "mcp-name", &encode(name));
            }
            let tool = (m.get("method").and_then(Value::as_str) == Some("tools/call"))
                .then(|| m.pointer("/params/name").and_then(Value::as_str))
                .flatten();
            if let Some(params) = tool.and_then(|t| self.tools.header_params(t)) {
                for (name, value) in mirrored(&params, m.pointer("/params/arguments")) {
                    let name = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes());
                    if let (Ok(name), Ok(value)) = (name, HeaderValue::from_str(&value)) {
                        headers.insert(name, value);
                    }
                }
            }
        }
        oncely_http::headers::sent_whole(&mut headers, body.len());
        let mut req = Request::new(full(body));
        *req.method_mut() = method;
        *req.uri_mut() = self.remote.url.clone();
        *req.headers_mut() = headers;
        req
    }
}

/// Sets the header `name` to `value` (left out when `value` cannot be a header value).
fn put(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
