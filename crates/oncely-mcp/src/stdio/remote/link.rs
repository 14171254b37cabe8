//! The remote server as the core's server ([`RemoteLink`]), over Streamable HTTP.
//! The link sends each message the core sends on as one `POST` to the server's URL
//! (with the [`Remote`]'s headers, the session the server gave at `initialize`, the
//! negotiated `MCP-Protocol-Version`, and in the stateless era the routing headers the
//! message implies), each request under an id of the link's own, and reads the answer,
//! JSON or an event stream, as it comes: the response to the request goes back to who
//! sent it under its client's id, every other message (the server's requests to the
//! client, such as sampling, and its notifications) goes to the client at once, so that a
//! tool that samples during its call is answered. A `202` is "nothing to answer". The
//! server's messages outside any request come on the `GET` stream the link opens once the
//! session is initialized. A `404` to a request in a session (the server restarted and
//! forgot it; a `400` that says so is one too, `crate::endpoint::send`) starts a new
//! session with the client's own `initialize`, and the request is sent again, once. At
//! the end, a session the server gave is ended with `DELETE`.
//!
//! What it keeps of the server between requests, and the request a message becomes, is
//! its [`Session`].
//!
//! The link's surface is what a server side needs: the core's [`MessageServer`] (one
//! message in, its response out), the client's lines ([`ToClient`]) for everything else,
//! [`RemoteLink::client_gone`] and [`RemoteLink::end`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use oncely_tower::{BoxBody, UpstreamError};
use serde_json::Value;
use tokio::sync::oneshot;

use super::session::{Remote, Session};
use crate::core::MessageServer;
use crate::endpoint::McpUpstream;
use crate::stdio::server::ToClient;
use crate::{jsonrpc, sse, BoxError};

/// JSON-RPC's "Internal error", for a request the server did not answer with a message.
use crate::jsonrpc::code::INTERNAL_ERROR;

/// The link to a remote server over Streamable HTTP: its session, the requests it runs.
pub(crate) struct RemoteLink {
    session: Session,
    client: McpUpstream,
    to_client: ToClient,
    /// Most bytes of one answer (a JSON body, an event's line).
    limit: usize,
    /// Held while a new session is started: one at a time.
    renewing: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
    /// Each request forwarded unguarded, by the client's id: its id of the link's (a
    /// cancellation of it is passed on under it) and what stops waiting for it.
    forwarded: Mutex<HashMap<String, (u64, oneshot::Sender<()>)>>,
    /// The client has gone: the server's requests to it are answered with an error.
    client_gone: AtomicBool,
    /// The `GET` stream of the server's messages outside any request, once opened.
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What one `POST` was answered with, read as far as the link needs.
enum Answered {
    /// The response to the request sent (its text, under the link's id).
    Response(Vec<u8>),
    /// Nothing to answer (`202`, or a body without the response to a notification).
    Nothing,
    /// `404` to a request in a session: the server no longer knows it (it restarted).
    SessionGone,
}

impl RemoteLink {
    /// A link to `remote` through `client`; the server's own messages go to `to_client`.
    pub(crate) fn new(
        remote: Remote,
        client: McpUpstream,
        to_client: ToClient,
        limit: usize,
    ) -> Arc<RemoteLink> {
        Arc::new(RemoteLink {
            session: Session::new(remote),
            client,
            to_client,
            limit,
            renewing: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
            forwarded: Mutex::new(HashMap::new()),
            client_gone: AtomicBool::new(false),
            listener: Mutex::new(None),
        })
    }

    /// The client has gone: nothing the server asks of it will be answered by it.
    pub(crate) fn client_gone(&self) {
        self.client_gone.store(true, Ordering::SeqCst);
    }

    /// Ends the link: the `GET` stream is closed and a session the server gave is ended
    /// with `DELETE` (a server that does not allow it answers 405; either way it is over).
    pub(crate) async fn end(&self) {
        if let Some(listener) = lock(&self.listener).take() {
            listener.abort();
        }
        if self.session.id().is_none() {
            return;
        }
        let req = self.session.request(Method::DELETE, Bytes::new(), None);
        match self.call(req).await {
            Ok(resp) => tracing::debug!(status = %resp.status(), "ended the remote session"),
            Err(e) => tracing::warn!(error = %e, "ending the remote MCP session failed"),
        }
    }

    /// Sends one message to the server; for a request, its response under the client's
    /// id (`None` for anything else, and for a request its client cancelled). `owner`:
    /// the guarded call's own send, which nothing the client sends cancels.
    pub(crate) fn send_text<'a>(
        self: &'a Arc<Self>,
        text: &'a str,
        owner: bool,
    ) -> futures::future::BoxFuture<'a, Result<Option<Vec<u8>>, BoxError>> {
        Box::pin(self.send_message(text, owner))
    }

    /// [`send_text`](Self::send_text)'s work (a boxed future breaks rustc's `Send` proof
    /// for the boxed error type, rust-lang/rust#64552).
    async fn send_message(
        self: &Arc<Self>,
        text: &str,
        owner: bool,
    ) -> Result<Option<Vec<u8>>, BoxError> {
        let value: Option<Value> = jsonrpc::parse(text.as_bytes());
        let request = value.as_ref().and_then(jsonrpc::as_request);
        let Some(request) = request else {
            let text = match value.as_ref().and_then(jsonrpc::cancelled_request_id) {
                Some(target) => match lock(&self.forwarded).remove(&target) {
                    // Its waiter stops waiting: the client gets no answer.
                    Some((ours, stop)) => {
                        let _ = stop.send(());
                        jsonrpc::with_cancelled_id(text, &ours.to_string())
                            .unwrap_or_else(|| text.to_owned())
                    }
                    // Not one of the requests the server runs for this client.
                    None => return Ok(None),
                },
                None => text.to_owned(),
            };
            let initialized = value
                .as_ref()
                .and_then(jsonrpc::as_notification)
                .is_some_and(|(m, _)| m == "notifications/initialized");
            self.post(text, value.as_ref(), None).await?;
            if initialized {
                self.listen();
            }
            return Ok(None);
        };
        let initialize = request.method == "initialize";
        if initialize {
            self.session.keep_initialize(text);
        }
        let client_id = jsonrpc::id_text(request.id);
        let ours = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (stop, stopped) = oneshot::channel();
        if !owner {
            lock(&self.forwarded).insert(client_id.clone(), (ours, stop));
        }
        // Dropped unanswered (the owner's timeout, a client gone): the server is told
        // that nobody waits for the request any more.
        let mut pending = Pending {
            link: self.clone(),
            ours,
            client: (!owner).then(|| client_id.clone()),
            answered: false,
        };
        let line = jsonrpc::with_id(text, &ours.to_string()).ok_or_else(|| {
            UpstreamError::BeforeSend("the request is not a JSON object".to_string())
        })?;
        let answered = tokio::select! {
            answered = self.post(line, value.as_ref(), Some(ours)) => Some(answered),
            // The client cancelled it (and the server was told): no answer.
            Ok(()) = stopped => None,
        };
        pending.answered = true;
        let Some(answered) = answered else {
            return Ok(None);
        };
        let bytes = match answered? {
            Answered::Response(bytes) => bytes,
            // (`post` sends again in a new session after a `SessionGone`.)
            Answered::Nothing | Answered::SessionGone => {
                let refusal = jsonrpc::error_message(
                    &Value::from(ours),
                    INTERNAL_ERROR,
                    "the MCP server answered the request with no response",
                );
                serde_json::to_vec(&refusal).unwrap_or_default()
            }
        };
        if initialize {
            self.session.learn_revision(&bytes);
        }
        if request.method == "tools/list" {
            self.session.learn_tools(&bytes);
        }
        let text = std::str::from_utf8(&bytes).unwrap_or_default();
        Ok(Some(
            jsonrpc::with_id(text, &client_id)
                .map(String::into_bytes)
                .unwrap_or(bytes),
        ))
    }

    /// Sends `text` as one `POST` and reads the answer: the response to `ours` (a
    /// request's id), everything else to the client as it comes. When the server answers
    /// that it does not know the session (it restarted), a new one is started and `text`
    /// sent again, once: nothing of it ran.
    fn post<'a>(
        &'a self,
        text: String,
        message: Option<&'a Value>,
        ours: Option<u64>,
    ) -> futures::future::BoxFuture<'a, Result<Answered, BoxError>> {
        Box::pin(async move {
            let session = self.session.id();
            match self.posted(text.clone(), message, ours).await? {
                Answered::SessionGone => {}
                answered => return Ok(answered),
            }
            self.renew(session).await?;
            match self.posted(text, message, ours).await? {
                Answered::SessionGone => Err(UpstreamError::BeforeSend(
                    "the MCP server does not know the session it just gave".into(),
                )
                .into()),
                answered => Ok(answered),
            }
        })
    }

    /// Starts a new session with the client's `initialize` (and `initialized`) in place
    /// of `stale`, unless another request did already.
    async fn renew(&self, stale: Option<HeaderValue>) -> Result<(), BoxError> {
        let _one = self.renewing.lock().await;
        if self.session.id() != stale {
            return Ok(());
        }
        let gone = || UpstreamError::BeforeSend("the MCP server forgot the session".into());
        let init = self.session.initialize().ok_or_else(gone)?;
        let ours = self.next_id.fetch_add(1, Ordering::Relaxed);
        let init = jsonrpc::with_id(&init, &ours.to_string()).ok_or_else(gone)?;
        let message = jsonrpc::parse(init.as_bytes());
        tracing::warn!("the remote MCP server no longer knows the session: starting a new one");
        self.session.set_id(None);
        match self.posted(init, message.as_ref(), Some(ours)).await? {
            Answered::Response(_) if self.session.id().is_some() => {}
            _ => return Err(gone().into()),
        }
        let initialized =
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.posted(initialized.to_string(), Some(&initialized), None)
            .await?;
        Ok(())
    }

    /// [`post`](Self::post)'s work.
    async fn posted(
        &self,
        text: String,
        message: Option<&Value>,
        ours: Option<u64>,
    ) -> Result<Answered, BoxError> {
        let req = self
            .session
            .request(Method::POST, Bytes::from(text), message);
        let in_session = req.headers().contains_key("mcp-session-id");
        let resp = self.call(req).await?;
        let (parts, body) = resp.into_parts();
        if in_session && parts.status == StatusCode::NOT_FOUND {
            return Ok(Answered::SessionGone);
        }
        let method = message
            .and_then(|m| m.get("method"))
            .and_then(Value::as_str);
        if ours.is_some() && method == Some("initialize") {
            if let Some(session) = parts.headers.get("mcp-session-id") {
                self.session.set_id(Some(session.clone()));
            }
        }
        let is_sse = content_type(&parts.headers).starts_with("text/event-stream");
        if parts.status.is_success() && is_sse {
            return self.read_stream(body, ours).await;
        }
        let bytes = self.read_body(body).await?;
        let mut response = None;
        for message in json_messages(&bytes) {
            match ours {
                Some(id)
                    if message.get("id") == Some(&Value::from(id)) && is_response(&message) =>
                {
                    response = Some(serde_json::to_vec(&message).unwrap_or_default());
                }
                _ if is_response(&message) => {}
                _ => self.pass_on(message),
            }
        }
        match (response, ours) {
            (Some(response), _) => Ok(Answered::Response(response)),
            (None, Some(id)) if !parts.status.is_success() => {
                let start = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
                let why = format!(
                    "the MCP server answered HTTP {}: {}",
                    parts.status,
                    start.trim()
                );
                let error = jsonrpc::error_message(&Value::from(id), INTERNAL_ERROR, &why);
                Ok(Answered::Response(
                    serde_json::to_vec(&error).unwrap_or_default(),
                ))
            }
            (None, _) => {
                if !parts.status.is_success() {
                    tracing::warn!(status = %parts.status,
                        "the MCP server refused a message of the client's");
                }
                Ok(Answered::Nothing)
            }
        }
    }

    /// A whole body, at most `limit` bytes of it.
    async fn read_body(&self, mut body: BoxBody) -> Result<Vec<u8>, UpstreamError> {
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|e| UpstreamError::AfterSend(format!("reading the answer: {e}")))?;
            if let Ok(data) = frame.into_data() {
                if bytes.len() + data.len() > self.limit {
                    return Err(UpstreamError::AfterSend("the answer is too large".into()));
                }
                bytes.extend_from_slice(&data);
            }
        }
        Ok(bytes)
    }

    /// Reads an event stream as it comes: each message of the server's goes to the
    /// client at once, until the response to `ours` (then the stream is left).
    async fn read_stream(
        &self,
        mut body: BoxBody,
        ours: Option<u64>,
    ) -> Result<Answered, BoxError> {
        let mut parser = sse::Parser::new(self.limit);
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| UpstreamError::AfterSend(format!("the stream broke off: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for event in parser.feed(&data) {
                let Some(message) = jsonrpc::parse(event.data.as_bytes()) else {
                    continue;
                };
                let ours_answered = ours.is_some_and(|id| {
                    is_response(&message) && message.get("id") == Some(&Value::from(id))
                });
                if ours_answered {
                    return Ok(Answered::Response(event.data.into_bytes()));
                }
                if !is_response(&message) {
                    self.pass_on(message);
                }
            }
        }
        match ours {
            Some(_) => Err(UpstreamError::AfterSend(
                "the MCP server's stream ended before the response".into(),
            )
            .into()),
            None => Ok(Answered::Nothing),
        }
    }

    /// A message of the server's own (a request to the client, a notification): to the
    /// client; a request while the client is gone is refused here.
    fn pass_on(&self, message: Value) {
        let request_id = jsonrpc::as_request(&message).map(|r| r.id.clone());
        let bytes = serde_json::to_vec(&message).unwrap_or_default();
        match request_id {
            Some(id) if self.client_gone.load(Ordering::SeqCst) => {
                let refusal = jsonrpc::error_message(&id, INTERNAL_ERROR, "the client has gone");
                self.spawn_post(refusal);
            }
            Some(_) => self.to_client.send(bytes),
            None => self.to_client.notify(bytes),
        }
    }

    /// Opens the `GET` stream of the server's messages outside any request (once, in a
    /// session): a server that offers none answers 405.
    fn listen(self: &Arc<Self>) {
        let mut listener = lock(&self.listener);
        if listener.is_some() || self.session.id().is_none() {
            return;
        }
        let link = self.clone();
        *listener = Some(tokio::spawn(async move {
            let mut req = link.session.request(Method::GET, Bytes::new(), None);
            req.headers_mut()
                .insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
            match link.call(req).await {
                Ok(resp)
                    if resp.status().is_success()
                        && content_type(resp.headers()).starts_with("text/event-stream") =>
                {
                    let _ = link.read_stream(resp.into_body(), None).await;
                }
                Ok(resp) => tracing::debug!(status = %resp.status(), "no GET stream"),
                Err(e) => tracing::debug!(error = %e, "no GET stream"),
            }
        }));
    }

    /// Posts `message` on a task of its own, its answer dropped (a refusal, a
    /// cancellation from a `Drop`).
    fn spawn_post(&self, message: Value) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let req = self
            .session
            .request(Method::POST, message.to_string().into(), Some(&message));
        let sent = self.call(req);
        handle.spawn(async move {
            let _ = sent.await;
        });
    }

    /// `req` sent through the client, as the endpoint sends it (a forgotten session is
    /// a `404` in whatever form the server said it).
    fn call(
        &self,
        req: Request<BoxBody>,
    ) -> futures::future::BoxFuture<'static, Result<Response<BoxBody>, BoxError>> {
        crate::endpoint::send(self.client.clone(), req)
    }
}

/// A request sent and waited for; dropped unanswered, the server is told
/// (`notifications/cancelled`) that nobody waits for it.
struct Pending {
    link: Arc<RemoteLink>,
    ours: u64,
    client: Option<String>,
    answered: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(client) = &self.client {
            let mut forwarded = lock(&self.link.forwarded);
            if forwarded
                .get(client)
                .is_some_and(|(ours, _)| *ours == self.ours)
            {
                forwarded.remove(client);
            }
        }
        if !self.answered {
            self.link.spawn_post(serde_json::json!({
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": self.ours,
                    "reason": "nobody waits for the answer any more"},
            }));
        }
    }
}

/// The messages of a JSON body: one, or each of a batch (none when it is not JSON).
fn json_messages(body: &[u8]) -> Vec<Value> {
    match jsonrpc::parse(body) {
        Some(Value::Array(messages)) => messages,
        Some(message) => vec![message],
        None => Vec::new(),
    }
}

/// Whether `message` is a response (a result or an error, no method).
fn is_response(message: &Value) -> bool {
    message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// The `Content-Type`, lowercased ("" without one).
fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;

impl MessageServer for RemoteLink {
    fn send_one(
        self: Arc<Self>,
        text: String,
        owner: bool,
    ) -> futures::future::BoxFuture<'static, Result<Option<Vec<u8>>, UpstreamError>> {
        Box::pin(async move {
            let link = self;
            link.send_text(&text, owner)
                .await
                .map_err(oncely_tower::upstream_error)
        })
    }
}
