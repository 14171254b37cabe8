//! The remote server as the endpoint's upstream ([`RemoteLink`]), over Streamable HTTP.
//! The link sends each message the endpoint forwards as one `POST` to the server's URL
//! (with the [`Remote`]'s headers, the session the server gave at `initialize`, the
//! negotiated `MCP-Protocol-Version`, and in the stateless era the routing headers the
//! message implies), each request under an id of the link's own, and reads the answer,
//! JSON or an event stream, as it comes: the response to the request goes back to who
//! sent it under its client's id, every other message (the server's requests to the
//! client, such as sampling, and its notifications) goes to the client at once, so that a
//! tool that samples during its call is answered. A `202` is "nothing to answer". The
//! server's messages outside any request come on the `GET` stream the link opens once the
//! session is initialized. At the end, a session the server gave is ended with `DELETE`.
//!
//! The link's surface is what a server side needs: [`RemoteLink::send_one`] (one
//! message in, its response out), the client's lines ([`ToClient`]) for everything else,
//! [`RemoteLink::client_gone`] and [`RemoteLink::end`]; [`RemoteLink::upstream`] adapts
//! it to the endpoint's HTTP upstream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::FutureExt;
use http::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use oncely_tower::{BoxBody, OwnerSend, UpstreamError};
use serde_json::Value;
use tokio::sync::oneshot;
use tower::ServiceExt;

use crate::body::full;
use crate::endpoint::{is_stateless, McpUpstream};
use crate::stdio::server::ToClient;
use crate::{jsonrpc, sse, BoxError};

/// JSON-RPC's "Internal error", for a request the server did not answer with a message.
const INTERNAL_ERROR: i64 = -32603;

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

/// The link to a remote server over Streamable HTTP: its session, the requests it runs.
pub(crate) struct RemoteLink {
    remote: Remote,
    client: McpUpstream,
    to_client: ToClient,
    /// Most bytes of one answer (a JSON body, an event's line).
    limit: usize,
    /// The server's `Mcp-Session-Id`, once `initialize` was answered with one.
    session: Mutex<Option<HeaderValue>>,
    /// The negotiated protocol revision, once `initialize` was answered.
    revision: Mutex<Option<String>>,
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
            remote,
            client,
            to_client,
            limit,
            session: Mutex::new(None),
            revision: Mutex::new(None),
            next_id: AtomicU64::new(1),
            forwarded: Mutex::new(HashMap::new()),
            client_gone: AtomicBool::new(false),
            listener: Mutex::new(None),
        })
    }

    /// The endpoint's upstream: each message (or batch) it forwards is sent on this link,
    /// and answered as an HTTP upstream would: 200 with the responses to its requests,
    /// 202 when it held none.
    pub(crate) fn upstream(self: &Arc<Self>) -> McpUpstream {
        let link = self.clone();
        McpUpstream::new(tower::service_fn(move |req: Request<BoxBody>| {
            let link = link.clone();
            async move { link.forward(req).await }.boxed()
        }))
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
        if lock(&self.session).is_none() {
            return;
        }
        let req = self.request(Method::DELETE, Bytes::new(), None);
        match self.call(req).await {
            Ok(resp) => tracing::debug!(status = %resp.status(), "ended the remote session"),
            Err(e) => tracing::warn!(error = %e, "ending the remote MCP session failed"),
        }
    }

    /// One forwarded body: a message, or a batch sent message by message.
    async fn forward(
        self: Arc<Self>,
        req: Request<BoxBody>,
    ) -> Result<Response<BoxBody>, BoxError> {
        let owner = req.extensions().get::<OwnerSend>().is_some();
        let body = req
            .into_body()
            .collect()
            .await
            .map_err(|e| UpstreamError::BeforeSend(e.to_string()))?
            .to_bytes();
        let text = std::str::from_utf8(&body)
            .map_err(|_| UpstreamError::BeforeSend("the message is not UTF-8".into()))?;
        let answers = match jsonrpc::batch_texts(text) {
            Some(items) => {
                let sent = items.into_iter().map(|item| self.send_one(item, owner));
                let mut answers = Vec::new();
                for answer in futures::future::join_all(sent).await {
                    answers.extend(answer?);
                }
                (!answers.is_empty()).then(|| {
                    let mut batch = b"[".to_vec();
                    batch.extend(answers.join(&b","[..]));
                    batch.push(b']');
                    batch
                })
            }
            None => self.send_one(text, owner).await?,
        };
        Ok(match answers {
            Some(body) => {
                let mut resp = Response::new(full(body));
                resp.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                resp
            }
            None => {
                let mut resp = Response::new(full(Bytes::new()));
                *resp.status_mut() = StatusCode::ACCEPTED;
                resp
            }
        })
    }

    /// Sends one message to the server; for a request, its response under the client's
    /// id (`None` for anything else, and for a request its client cancelled). `owner`:
    /// the guarded call's own send, which nothing the client sends cancels.
    pub(crate) fn send_one<'a>(
        self: &'a Arc<Self>,
        text: &'a str,
        owner: bool,
    ) -> futures::future::BoxFuture<'a, Result<Option<Vec<u8>>, BoxError>> {
        Box::pin(self.send_message(text, owner))
    }

    /// [`send_one`](Self::send_one)'s work (a boxed future breaks rustc's `Send` proof
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
            Answered::Nothing => {
                let refusal = jsonrpc::error_message(
                    &Value::from(ours),
                    INTERNAL_ERROR,
                    "the MCP server answered the request with no response",
                );
                serde_json::to_vec(&refusal).unwrap_or_default()
            }
        };
        if initialize {
            self.learn_revision(&bytes);
        }
        let text = std::str::from_utf8(&bytes).unwrap_or_default();
        Ok(Some(
            jsonrpc::with_id(text, &client_id)
                .map(String::into_bytes)
                .unwrap_or(bytes),
        ))
    }

    /// Sends `text` as one `POST` and reads the answer: the response to `ours` (a
    /// request's id), everything else to the client as it comes.
    fn post<'a>(
        &'a self,
        text: String,
        message: Option<&'a Value>,
        ours: Option<u64>,
    ) -> futures::future::BoxFuture<'a, Result<Answered, BoxError>> {
        Box::pin(self.posted(text, message, ours))
    }

    /// [`post`](Self::post)'s work.
    async fn posted(
        &self,
        text: String,
        message: Option<&Value>,
        ours: Option<u64>,
    ) -> Result<Answered, BoxError> {
        let req = self.request(Method::POST, Bytes::from(text), message);
        let resp = self.call(req).await?;
        let (parts, body) = resp.into_parts();
        let method = message
            .and_then(|m| m.get("method"))
            .and_then(Value::as_str);
        if ours.is_some() && method == Some("initialize") {
            if let Some(session) = parts.headers.get("mcp-session-id") {
                *lock(&self.session) = Some(session.clone());
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
        if listener.is_some() || lock(&self.session).is_none() {
            return;
        }
        let link = self.clone();
        *listener = Some(tokio::spawn(async move {
            let mut req = link.request(Method::GET, Bytes::new(), None);
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
        let req = self.request(Method::POST, message.to_string().into(), Some(&message));
        let sent = self.call(req);
        handle.spawn(async move {
            let _ = sent.await;
        });
    }

    /// The request to the server with `body`: the remote's headers, the session, the
    /// revision and, in the stateless era, the routing headers `message` implies.
    fn request(&self, method: Method, body: Bytes, message: Option<&Value>) -> Request<BoxBody> {
        let mut headers = self.remote.headers.clone();
        if method == Method::POST {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if let Some(session) = lock(&self.session).clone() {
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
                put(&mut headers, "mcp-name", name);
            }
        }
        oncely_http::headers::sent_whole(&mut headers, body.len());
        let mut req = Request::new(full(body));
        *req.method_mut() = method;
        *req.uri_mut() = self.remote.url.clone();
        *req.headers_mut() = headers;
        req
    }

    /// `req` sent through the client. A boxed future (see `endpoint::state::send`).
    fn call(
        &self,
        req: Request<BoxBody>,
    ) -> futures::future::BoxFuture<'static, Result<Response<BoxBody>, BoxError>> {
        Box::pin(self.client.clone().oneshot(req))
    }

    /// Keeps the revision `initialize` was answered with.
    fn learn_revision(&self, response: &[u8]) {
        let value: Option<Value> = jsonrpc::parse(response);
        let revision = value
            .as_ref()
            .and_then(|v| v.pointer("/result/protocolVersion"))
            .and_then(Value::as_str);
        if let Some(revision) = revision {
            *lock(&self.revision) = Some(revision.to_owned());
        }
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

/// Sets the header `name` to `value` (left out when `value` cannot be a header value).
fn put(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use serde_json::json;
    use tokio::sync::mpsc;

    use super::*;
    use crate::stdio::server::Queued;

    /// What the fake server saw: each request's method, headers and body.
    type Seen = Arc<Mutex<Vec<(Method, HeaderMap, Value)>>>;

    /// A fake server: `initialize` answered with JSON and a session, `tools/call` with an
    /// event stream the test writes to (`events`), anything else 202.
    fn fake(seen: Seen, events: futures::channel::mpsc::UnboundedReceiver<String>) -> McpUpstream {
        let events = Arc::new(Mutex::new(Some(events)));
        McpUpstream::new(tower::service_fn(move |req: Request<BoxBody>| {
            let (seen, events) = (seen.clone(), events.clone());
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect().await?.to_bytes();
                let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                lock(&seen).push((parts.method, parts.headers, message.clone()));
                let mut resp = Response::new(full(Bytes::new()));
                match message["method"].as_str() {
                    Some("initialize") => {
                        let answer = json!({"jsonrpc": "2.0", "id": message["id"],
                            "result": {"protocolVersion": "2025-11-25"}});
                        resp = Response::new(full(answer.to_string()));
                        let headers = resp.headers_mut();
                        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                        headers.insert("mcp-session-id", HeaderValue::from_static("s-1"));
                    }
                    Some("tools/call") => {
                        let stream = lock(&events).take().expect("one call");
                        let frames = stream.map(|e| {
                            Ok::<_, BoxError>(Frame::data(Bytes::from(format!("data: {e}\n\n"))))
                        });
                        resp = Response::new(BodyExt::boxed(StreamBody::new(frames)));
                        resp.headers_mut()
                            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
                    }
                    _ => *resp.status_mut() = StatusCode::ACCEPTED,
                }
                Ok::<_, BoxError>(resp)
            }
            .boxed()
        }))
    }

    #[tokio::test]
    async fn a_server_request_mid_stream_reaches_the_client_before_the_response() {
        let seen: Seen = Arc::default();
        let (events, stream) = futures::channel::mpsc::unbounded();
        let (lines, mut to_client) = mpsc::unbounded_channel();
        let client = ToClient::new(lines, Arc::new(Queued::default()));
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer t"));
        let remote = Remote {
            url: "http://127.0.0.1:9/mcp".parse().unwrap(),
            headers,
        };
        let link = RemoteLink::new(remote, fake(seen.clone(), stream), client, 1 << 20);

        let init = r#"{"jsonrpc":"2.0","id":"i","method":"initialize","params":{}}"#;
        let answer = link.send_one(init, false).await.unwrap().unwrap();
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer["id"], "i", "under the client's id: {answer}");
        let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ask"}}"#;
        let running = tokio::spawn({
            let link = link.clone();
            async move { link.send_one(call, true).await.unwrap() }
        });
        let sampling = json!({"jsonrpc": "2.0", "id": 0, "method": "sampling/createMessage"});
        events.unbounded_send(sampling.to_string()).unwrap();
        let line = tokio::time::timeout(Duration::from_secs(5), to_client.recv())
            .await
            .expect("the server's request reaches the client while the call runs")
            .unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&line).unwrap(), sampling);
        assert!(!running.is_finished());
        let ours = lock(&seen)[1].2["id"].clone();
        assert_ne!(ours, 7, "the link's own id");
        let result = json!({"jsonrpc": "2.0", "id": ours, "result": {"content": []}});
        events.unbounded_send(result.to_string()).unwrap();
        let answer = running.await.unwrap().unwrap();
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(
            answer,
            json!({"jsonrpc": "2.0", "id": 7, "result": {"content": []}})
        );
        link.end().await;

        let seen = lock(&seen);
        let (_, first, _) = &seen[0];
        assert_eq!(first["authorization"], "Bearer t");
        assert_eq!(first[ACCEPT], "application/json, text/event-stream");
        assert!(
            first.get("mcp-session-id").is_none(),
            "none before initialize"
        );
        let (_, call, _) = &seen[1];
        assert_eq!(call["mcp-session-id"], "s-1");
        assert_eq!(call["mcp-protocol-version"], "2025-11-25");
        assert!(
            call.get("mcp-method").is_none(),
            "no routing headers before 2026-07-28"
        );
        let (method, end, _) = seen.last().unwrap();
        assert_eq!(
            (method, &end["mcp-session-id"]),
            (&Method::DELETE, &HeaderValue::from_static("s-1"))
        );
    }

    #[test]
    fn the_stateless_era_gets_the_routing_headers_of_its_message() {
        let (lines, _to_client) = mpsc::unbounded_channel();
        let client = ToClient::new(lines, Arc::new(Queued::default()));
        let remote = Remote {
            url: "http://127.0.0.1:9/mcp".parse().unwrap(),
            headers: HeaderMap::new(),
        };
        let (_, stream) = futures::channel::mpsc::unbounded();
        let link = RemoteLink::new(remote, fake(Arc::default(), stream), client, 1 << 20);
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "render",
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        let req = link.request(Method::POST, Bytes::new(), Some(&message));
        let headers = req.headers();
        assert_eq!(headers["mcp-protocol-version"], "2026-07-28");
        assert_eq!(headers["mcp-method"], "tools/call");
        assert_eq!(headers["mcp-name"], "render");
    }
}
