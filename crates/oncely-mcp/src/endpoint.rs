//! The HTTP service of one `[[mcp]]` endpoint.
//!
//! Every request is forwarded to the upstream MCP server unchanged and its answer streamed
//! back frame by frame, except:
//! - a guarded `tools/call` (see [`crate::catalog`]): handed to the gateway's one engine,
//!   [`oncely_tower::Guard::execute`], which claims it on the ledger and runs it on an owner
//!   task the client's connection does not own (renewing its lease, streaming the answer to
//!   the caller, recording it), or answers from the ledger; this module maps each
//!   [`Execution`] to an MCP answer (a replayed result under the repeat's own id, or an
//!   `isError` result that says the original still runs);
//! - a `notifications/cancelled` naming a guarded call in flight: acknowledged with 202 and
//!   never forwarded, so the client's timeout never abandons the paid work upstream; in a
//!   session it is honoured towards the client, whose request gets no (more) answer;
//! - a session's end (`DELETE`) while calls this endpoint owns run on that session:
//!   answered 200 at once, and forwarded once those calls are recorded (the server would
//!   abort them);
//! - a `tools/list` answer: passed through, read on the way to learn which tools are
//!   read-only, and with every guarded tool's `execution.taskSupport` set to `forbidden`
//!   (2025-11-25's task-augmented calls never take a guarded call around the guard);
//! - a `server/discover` answer: passed through with the tasks extension advertised;
//! - `tasks/get`, `tasks/cancel`, `tasks/update` (2026-07-28): answered from the ledger
//!   for this endpoint's tasks (see [`crate::tasks`]), forwarded for the server's own.
//!
//! A guarded call is keyed by what [`jsonrpc::ToolCall`] reads (tool, arguments, and a
//! multi-round-trip continuation's `inputResponses` and `requestState`), so nothing else
//! it carries changes whether or how it is guarded. The forwarded guarded call carries
//! the derived downstream key in `_meta["dev.oncely/idempotency-key"]` and no `task`
//! parameter; tools listed in `actions` are class `action`.
//! What is stored is decided by a [`Classifier`] once the owner task has read the whole
//! answer: the JSON-RPC `result` for the call's id (found in a JSON body, a batch, or an
//! event stream) is stored; a JSON-RPC `error` or an HTTP error releases the record, so
//! the next identical call runs again, and so does an `input_required` result (the server
//! asks for input: the continuation that answers it is the call that executes); an answer
//! that ends (or breaks off) without the
//! call's response marks it `outcome_unknown` (it was sent and may have run). An answer over
//! `max_response` is stored without its body: repeats get an `isError` result saying the
//! result was too large to keep, and the tool does not run again within the window.
//! Every result oncely writes is shaped for the request's revision (`for_revision`).
//!
//! A `tools/call` inside a JSON-RPC batch (protocol 2025-03-26 only; batching was removed
//! in 2025-06-18) is guarded too: the batch is split, each guarded call goes through the
//! engine on its own, the rest is forwarded as a smaller batch, and the answers are joined
//! into one JSON array.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use http_body_util::BodyExt;
use oncely_core::{DownstreamKey, Record, State, StoredResponse};
use oncely_http::client::ClientOptions;
use oncely_http::problem::{
    Problem, ProblemCode, IDEMPOTENT_REPLAYED, ONCELY_RECORD, ONCELY_STATUS,
};
use oncely_http::request_log::{Counted, RequestLine};
use oncely_tower::client::UpstreamClient;
use oncely_tower::trace::{attr, Span};
use oncely_tower::{
    BoxBody, Classified, Classifier, Execution, Guard, GuardedCall, OwnerSend, RequestFacts,
    RequestHead, UpstreamError, UpstreamFailure, UpstreamResponse,
};
use serde_json::{json, Value};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::body::{full, BreakAsEnd, Edit, EditFn, McpBody, UntilCancelled};
use crate::catalog::ToolCatalog;
use crate::config::McpConfig;
use crate::jsonrpc::{self, Outcome, ToolCall, REPLAY_META_KEY};
use crate::sse;
use crate::tasks::{self, History, TaskStatus};
use crate::{BoxError, McpError};

/// Where an endpoint sends everything it forwards, guarded or not: a tower service from a
/// request (its URI the MCP server's, its headers as the client sent them) to the
/// server's answer. The gateway gives each endpoint a proxy of its own (the entry's
/// `retries`, `Forwarded` and `X-Forwarded-*`); [`McpEndpoint::direct`] is the plain one.
/// An error that is an [`UpstreamError`] tells "nothing was sent" from "it may have been";
/// any other error counts as "it may have been".
pub type McpUpstream =
    tower::util::BoxCloneSyncService<Request<BoxBody>, Response<BoxBody>, BoxError>;

/// The environment variable naming extra CA certificates (PEM) for `https://` upstreams
/// (the gateway's proxy reads the same one).
pub use oncely_http::client::EXTRA_CA_ENV;

/// JSON-RPC error code of MCP 2026-07-28 for routing headers that disagree with the body.
pub const HEADER_MISMATCH: i64 = -32020;

/// JSON-RPC's "Invalid Request": a `tools/call` whose JSON repeats a member name.
pub const INVALID_REQUEST: i64 = -32600;

/// Why a `tools/call` that repeats a member name is refused: servers disagree on which of
/// the values counts (most take the last, some the first, some refuse), so oncely cannot
/// know which call it would be guarding.
const REPEATED_NAME: &str = "the tools/call repeats a member name in its JSON; send each \
    member once (servers disagree on which value counts, so oncely cannot guard it)";

/// Protocol revisions that use the initialize handshake and sessions; any later one is
/// the stateless era (2026-07-28), whose routing headers must match the body.
const HANDSHAKE_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Most bytes of a JSON answer oncely reads to edit it (`tools/list`, `server/discover`);
/// a larger one passes through unread.
const EDIT_LIMIT: usize = 8 << 20;

/// One `[[mcp]]` endpoint: a tower `Service<http::Request<B>>` answering
/// `Response<McpBody>`. Cheap to clone (shared state behind an `Arc`).
#[derive(Clone)]
pub struct McpEndpoint {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for McpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpEndpoint")
            .field("path", &self.inner.config.path)
            .field("upstream", &self.inner.config.upstream)
            .finish()
    }
}

struct Inner {
    config: McpConfig,
    guard: Arc<Guard>,
    upstream: McpUpstream,
    catalog: ToolCatalog,
    /// Guarded calls this endpoint is answering or running now, by (session, request id):
    /// their cancellations are dropped.
    guarded: Mutex<HashMap<(Option<String>, String), Guarded>>,
    /// Upstream calls this endpoint owns now, by the client session they were sent on: the
    /// session's end (`DELETE`) is held back from the upstream until they are done.
    owned: Mutex<HashMap<String, usize>>,
    /// Woken whenever an owned call ends.
    owned_ended: tokio::sync::Notify,
}

impl McpEndpoint {
    /// The plain upstream: a pooled HTTP/1.1 client for `http://` and `https://` MCP
    /// servers, trusting the system's root certificates, plus the PEM certificates in
    /// `extra_ca` and in the file `$ONCELY_EXTRA_CA_FILE` names (`oncely_tower::client`,
    /// the gateway's one client), sending each request to its URI.
    pub fn direct(extra_ca: Option<&Path>) -> Result<McpUpstream, McpError> {
        let options = ClientOptions {
            pool_idle_timeout: Some(Duration::from_secs(60)),
            ..ClientOptions::with_extra_ca(extra_ca)
        };
        let client = UpstreamClient::new(&options).map_err(|e| McpError::Config(e.to_string()))?;
        Ok(McpUpstream::new(client.direct()))
    }

    /// Builds the endpoint for `config`, guarding calls with `guard` (the gateway's one
    /// engine: its ledger, its principal hashing, its owner tasks), sending upstream
    /// through `upstream`.
    pub fn new(config: McpConfig, guard: Arc<Guard>, upstream: McpUpstream) -> McpEndpoint {
        McpEndpoint {
            inner: Arc::new(Inner {
                config,
                guard,
                upstream,
                catalog: ToolCatalog::new(),
                guarded: Mutex::new(HashMap::new()),
                owned: Mutex::new(HashMap::new()),
                owned_ended: tokio::sync::Notify::new(),
            }),
        }
    }

    /// The path this endpoint serves.
    pub fn path(&self) -> &str {
        &self.inner.config.path
    }

    /// What the endpoint has learned about the upstream's tools.
    pub fn catalog(&self) -> &ToolCatalog {
        &self.inner.catalog
    }

    /// Answers one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<McpBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        self.inner.clone().handle(req).await
    }
}

impl<B> tower::Service<Request<B>> for McpEndpoint
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<McpBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<McpBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { Ok(inner.handle(req).await) })
    }
}

/// A guarded call's entry in the cancellation filter: how many hold it (its callers, its
/// owner's upstream call), and whether its client has cancelled it.
struct Guarded {
    count: usize,
    cancelled: tokio::sync::watch::Sender<bool>,
}

/// Removes a guarded call from the cancellation filter when dropped (and, for the owner's
/// upstream call, from its session's count of owned calls).
struct Tracked {
    inner: Arc<Inner>,
    key: (Option<String>, String),
    owner: bool,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut map = self.inner.guarded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&self.key) {
            entry.count -= 1;
            if entry.count == 0 {
                map.remove(&self.key);
            }
        }
        drop(map);
        if let (true, Some(session)) = (self.owner, &self.key.0) {
            let mut owned = self.inner.owned.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = owned.get_mut(session) {
                *n -= 1;
                if *n == 0 {
                    owned.remove(session);
                }
            }
            drop(owned);
            self.inner.owned_ended.notify_waiters();
        }
    }
}

/// One guarded call, as read from its request.
struct Call {
    id: Value,
    tool: String,
    guarded: GuardedCall,
    /// The session negotiated 2026-07-28 (or later): results carry `resultType`.
    modern: bool,
    /// The request declared the tasks extension (2026-07-28): a call that outlives
    /// `wait` is answered with a task.
    tasks: bool,
    /// The call's server span (traces on), ended by `observe`.
    span: Mutex<Option<Span>>,
}

impl Inner {
    async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<McpBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = req.into_parts();
        let bytes = match oncely_tower::read_body(body, &parts.headers, self.config.max_body as u64)
            .await
        {
            Ok(bytes) => bytes,
            Err(p) => return p.into_response().map(|b| b.boxed()),
        };
        let session = header_str(&parts.headers, "mcp-session-id").map(str::to_string);
        if parts.method == Method::DELETE {
            if let Some(session) = session.clone().filter(|s| self.owns_calls_on(s)) {
                return self.end_session_later(parts, bytes, session);
            }
        }
        if parts.method != Method::POST {
            return self.forward(parts, bytes, Vec::new()).await;
        }
        let mut edits = Vec::new();
        match jsonrpc::parse(&bytes) {
            Some(message @ Value::Object(_)) => {
                if let Some(target) = jsonrpc::cancelled_request_id(&message) {
                    if self.is_guarded_in_flight(&session, &target) {
                        tracing::info!(route = %self.config.path, request_id = %target,
                            "dropped a cancellation of a guarded tools/call: the call runs to its end");
                        return empty(StatusCode::ACCEPTED);
                    }
                }
                let text = std::str::from_utf8(&bytes).unwrap_or_default();
                if let Some(refusal) = unreadable_call(&message, text) {
                    return json_response(StatusCode::BAD_REQUEST, &refusal);
                }
                if let Some(request) = jsonrpc::as_request(&message) {
                    match request.method {
                        "tools/call" => {
                            if let Some(mismatch) = header_mismatch(&parts.headers, &message, NAME)
                            {
                                return json_response(
                                    StatusCode::BAD_REQUEST,
                                    &jsonrpc::error_message(request.id, HEADER_MISMATCH, &mismatch),
                                );
                            }
                            if let Some(call) = self.read_call(&parts, &message, text) {
                                return self.clone().guard(&parts, bytes, call, &session).await;
                            }
                        }
                        "tools/list" => edits.push((request.id.clone(), Answer::ToolsList)),
                        "server/discover" => {
                            edits.push((request.id.clone(), Answer::Discover));
                        }
                        method if method.starts_with("tasks/") && is_modern(&parts.headers) => {
                            return self.task_request(parts, bytes, message).await;
                        }
                        _ => {}
                    }
                }
            }
            Some(Value::Array(items)) => return self.batch(parts, bytes, items, session).await,
            _ => {}
        }
        self.forward(parts, bytes, edits).await
    }

    /// A JSON-RPC batch (2025-03-26). Cancellations of guarded calls are taken out; each
    /// guarded `tools/call` goes through the guard on its own (forwarded as a single
    /// message); the rest is forwarded as a smaller batch; the answers are joined into one
    /// JSON array. A batch without a guarded call is forwarded as it came (streamed).
    async fn batch(
        self: Arc<Self>,
        parts: http::request::Parts,
        bytes: Bytes,
        items: Vec<Value>,
        session: Option<String>,
    ) -> Response<McpBody> {
        let mut rest = Vec::new();
        let mut rest_texts = Vec::new();
        let mut calls = Vec::new();
        let mut refused = Vec::new();
        let mut dropped = false;
        // Each item as it was written: what is forwarded, and what a guarded call's
        // arguments are fingerprinted from (a parsed `Value` rounds long numbers).
        let texts = std::str::from_utf8(&bytes)
            .ok()
            .and_then(jsonrpc::batch_texts)
            .filter(|t| t.len() == items.len())
            .map(|t| t.into_iter().map(str::to_string).collect::<Vec<_>>())
            .unwrap_or_else(|| items.iter().map(Value::to_string).collect());
        for (item, text) in items.into_iter().zip(texts) {
            if jsonrpc::cancelled_request_id(&item)
                .is_some_and(|id| self.is_guarded_in_flight(&session, &id))
            {
                dropped = true;
                continue;
            }
            if let Some(refusal) = unreadable_call(&item, &text) {
                refused.push(refusal);
                dropped = true;
                continue;
            }
            let call = jsonrpc::as_request(&item).filter(|r| r.method == "tools/call");
            let guarded = call.and_then(|_| self.read_call(&parts, &item, &text));
            match guarded {
                Some(call) => calls.push((text, call)),
                None => {
                    rest.push(item);
                    rest_texts.push(text);
                }
            }
        }
        let rest_bytes = Bytes::from(format!("[{}]", rest_texts.join(",")));
        let edits: Vec<(Value, Answer)> = rest
            .iter()
            .filter_map(jsonrpc::as_request)
            .filter(|r| r.method == "tools/list")
            .map(|r| (r.id.clone(), Answer::ToolsList))
            .collect();
        if calls.is_empty() && refused.is_empty() {
            if rest.is_empty() {
                return empty(StatusCode::ACCEPTED);
            }
            let bytes = if dropped { rest_bytes } else { bytes };
            return self.forward(parts, bytes, edits).await;
        }
        let expects_answer = rest.iter().any(|m| jsonrpc::as_request(m).is_some());
        let forwarded = async {
            if rest.is_empty() {
                return Vec::new();
            }
            let resp = self.clone().forward(parts.clone(), rest_bytes, edits).await;
            let ids: Vec<Value> = rest
                .iter()
                .filter_map(|m| jsonrpc::as_request(m).map(|r| r.id.clone()))
                .collect();
            responses_of(resp, &ids).await
        };
        let guarded = futures::future::join_all(calls.into_iter().map(|(text, call)| {
            let me = self.clone();
            let parts = parts.clone();
            let session = session.clone();
            async move {
                let id = call.id.clone();
                let resp = me.guard(&parts, Bytes::from(text), call, &session).await;
                responses_of(resp, std::slice::from_ref(&id)).await
            }
        }));
        let (mut answers, guarded) = tokio::join!(forwarded, guarded);
        answers.extend(guarded.into_iter().flatten());
        answers.extend(refused);
        if answers.is_empty() && !expects_answer {
            return empty(StatusCode::ACCEPTED);
        }
        json_response(StatusCode::OK, &Value::Array(answers))
    }

    fn owns_calls_on(&self, session: &str) -> bool {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.contains_key(session)
    }

    /// A client ends its session (`DELETE`) while upstream calls this endpoint owns run on
    /// it: the upstream would abort them (and a retry would pay again). The client's
    /// session ends now (answered 200); the upstream session ends once those calls are
    /// done and recorded (or after `timeout`, when they cannot still be running).
    fn end_session_later(
        self: Arc<Self>,
        parts: http::request::Parts,
        bytes: Bytes,
        session: String,
    ) -> Response<McpBody> {
        tracing::info!(route = %self.config.path, session = %session,
            "session end held back until its guarded tools/call calls are done");
        let me = self.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + me.config.timeout + Duration::from_secs(5);
            loop {
                let ended = me.owned_ended.notified();
                if !me.owns_calls_on(&session) {
                    break;
                }
                if tokio::time::timeout_at(deadline, ended).await.is_err() {
                    break;
                }
            }
            let resp = me.clone().forward(parts, bytes, Vec::new()).await;
            tracing::info!(route = %me.config.path, session = %session,
                status = resp.status().as_u16(), "held session end forwarded");
        });
        empty(StatusCode::OK)
    }

    /// Whether `id` names a guarded call in flight (its cancellation is then dropped). In
    /// a session, the cancellation is honoured towards the client: its request gets no
    /// more of the answer. Without a session, ids are not one client's, so nothing more.
    fn is_guarded_in_flight(&self, session: &Option<String>, id: &str) -> bool {
        let map = self.guarded.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&(session.clone(), id.to_string())) {
            Some(entry) => {
                if session.is_some() {
                    entry.cancelled.send_replace(true);
                }
                true
            }
            None => false,
        }
    }

    /// Resolves when the client cancels its call `id` of `session` (never without a
    /// session); `None` then.
    fn cancellation(&self, session: &Option<String>, id: &Value) -> Option<BoxFuture<'static, ()>> {
        session.as_ref()?;
        let map = self.guarded.lock().unwrap_or_else(|e| e.into_inner());
        let mut rx = map
            .get(&(session.clone(), jsonrpc::id_text(id)))?
            .cancelled
            .subscribe();
        Some(
            async move {
                if rx.wait_for(|c| *c).await.is_err() {
                    futures::future::pending::<()>().await;
                }
            }
            .boxed(),
        )
    }

    fn track(self: &Arc<Self>, session: &Option<String>, id: &Value, owner: bool) -> Tracked {
        let key = (session.clone(), jsonrpc::id_text(id));
        {
            let mut map = self.guarded.lock().unwrap_or_else(|e| e.into_inner());
            let entry = map.entry(key.clone()).or_insert_with(|| Guarded {
                count: 0,
                cancelled: tokio::sync::watch::channel(false).0,
            });
            entry.count += 1;
            if !owner {
                // A new request under this id: not cancelled (yet).
                entry.cancelled.send_replace(false);
            }
        }
        if let (true, Some(s)) = (owner, session) {
            *self
                .owned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(s.clone())
                .or_insert(0) += 1;
        }
        Tracked {
            inner: self.clone(),
            key,
            owner,
        }
    }

    /// The upstream request for `parts` with `body`: the server's URI with the client's
    /// query, the client's headers (the upstream service drops what crosses one hop) and
    /// extensions (who the client is, for `Forwarded`), and the length of `body`, which
    /// is sent whole.
    fn upstream_request(&self, parts: &http::request::Parts, body: Bytes) -> Request<BoxBody> {
        let base = &self.config.upstream;
        let path = base.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let pq = match parts.uri.query() {
            Some(q) if path.contains('?') => format!("{path}&{q}"),
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        };
        let uri = Uri::builder()
            .scheme(base.scheme_str().unwrap_or("http"))
            .authority(base.authority().map(|a| a.as_str()).unwrap_or_default())
            .path_and_query(pq)
            .build()
            .unwrap_or_else(|_| base.clone());
        let mut headers = parts.headers.clone();
        oncely_http::headers::sent_whole(&mut headers, body.len());
        let mut req = Request::new(full(body));
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        *req.extensions_mut() = parts.extensions.clone();
        req
    }

    /// Forwards unchanged and streams the answer back, with the responses to the requests
    /// `edits` names edited on the way (see [`Answer`]).
    async fn forward(
        self: Arc<Self>,
        parts: http::request::Parts,
        body: Bytes,
        edits: Vec<(Value, Answer)>,
    ) -> Response<McpBody> {
        let req = self.upstream_request(&parts, body);
        let resp = match send(self.upstream.clone(), req).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(route = %self.config.path, error = %e, "upstream unreachable");
                return problem(
                    ProblemCode::UpstreamUnreachable,
                    "the MCP server could not be reached",
                );
            }
        };
        let (mut rparts, body) = resp.into_parts();
        let body: McpBody = if edits.is_empty() || !rparts.status.is_success() {
            body
        } else {
            let is_sse = header_str(&rparts.headers, "content-type")
                .is_some_and(|c| c.to_ascii_lowercase().starts_with("text/event-stream"));
            // An edited answer has another length.
            rparts.headers.remove(http::header::CONTENT_LENGTH);
            Edit::new(body, is_sse, EDIT_LIMIT, self.editor(edits)).boxed()
        };
        Response::from_parts(rparts, body)
    }

    /// What [`Edit`] does to the responses to the requests `edits` names.
    fn editor(self: Arc<Self>, edits: Vec<(Value, Answer)>) -> EditFn {
        Box::new(move |message: &mut Value| {
            let Some(answer) = edits
                .iter()
                .find(|(id, _)| message.get("id") == Some(id))
                .map(|(_, a)| *a)
            else {
                return false;
            };
            let Some(result) = message.get_mut("result").filter(|r| r.is_object()) else {
                return false;
            };
            match answer {
                Answer::ToolsList => {
                    self.catalog.observe_list(result);
                    self.forbid_tasks(result)
                }
                Answer::Discover => advertise_tasks(result),
            }
        })
    }

    /// Sets `execution.taskSupport` to `forbidden` on every guarded tool of a `tools/list`
    /// result that offered task-augmented calls (2025-11-25): a client then calls it as
    /// a plain call, the one oncely guards. Says whether it changed anything.
    fn forbid_tasks(&self, result: &mut Value) -> bool {
        let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else {
            return false;
        };
        let mut changed = false;
        for tool in tools {
            let guarded = tool
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|name| self.catalog.is_guarded(&self.config.tools, name));
            let support = tool.pointer_mut("/execution/taskSupport");
            if let (true, Some(support)) = (guarded, support) {
                if support.as_str() != Some("forbidden") {
                    *support = Value::String("forbidden".into());
                    changed = true;
                }
            }
        }
        changed
    }

    /// Reads a guarded call, or `None` when it is forwarded as it is.
    /// `text` is `message` as it was written.
    fn read_call(&self, parts: &http::request::Parts, message: &Value, text: &str) -> Option<Call> {
        let request = jsonrpc::as_request(message)?;
        let read = ToolCall::read(message, text)?;
        let tool = read.tool;
        if !self.catalog.is_guarded(&self.config.tools, tool) {
            return None;
        }
        let head = RequestHead::of_parts(parts);
        let policy = self.config.policy_of(tool);
        // The principal's keyed hash is the gateway's (`Guard::principal_hash`), so one
        // account is one principal on HTTP routes and MCP endpoints alike; a call that
        // names none is forwarded as it is.
        let facts = RequestFacts::read(&self.guard, &policy.name, &head, &*self.config.principal);
        let principal = facts.principal?;
        // The units rule sees the call's arguments as the body (`{}` when absent).
        let arguments = read.arguments.unwrap_or("{}");
        let units = self.config.units.request_units(&head, arguments.as_bytes());
        // The texts as written, not as `message` holds them: a parsed number is a double
        // once it is past 64 bits or has many digits.
        let fingerprint = read.fingerprint(&principal, &self.config.path);
        let span = facts.span.map(|mut span| {
            span.set(attr::TOOL, tool);
            span
        });
        Some(Call {
            span: Mutex::new(span),
            id: request.id.clone(),
            tool: tool.to_string(),
            modern: is_modern(&parts.headers),
            tasks: is_modern(&parts.headers) && tasks::declares_tasks(request.params),
            guarded: policy.guarded_call(principal, None, fingerprint, facts.workflow_id, units),
        })
    }

    /// Runs a guarded call through the engine and answers in MCP terms.
    async fn guard(
        self: Arc<Self>,
        parts: &http::request::Parts,
        bytes: Bytes,
        call: Call,
        session: &Option<String>,
    ) -> Response<McpBody> {
        let started = Instant::now();
        // While this caller waits or runs, its cancellation is dropped; the owner's call
        // keeps its own entry until the owner task has recorded it.
        let _tracked = self.track(session, &call.id, false);
        let owner_tracked = self.track(session, &call.id, true);
        let me = self.clone();
        let parts = parts.clone();
        let parent = call
            .span
            .lock()
            .expect("call span lock")
            .as_ref()
            .map(Span::as_parent);
        let run = owner_call(me, parts, bytes, call.id.clone(), parent, owner_tracked);
        if call.tasks {
            return self.guard_as_task(call, run, started).await;
        }
        let Some(cancel) = self.cancellation(session, &call.id) else {
            let execution = self.guard.execute(call.guarded.clone(), run).await;
            return self.answer(execution, &call, started);
        };
        // The client may cancel its request: then it gets no answer (the revision's rule),
        // and the call, on a task of its own, runs on for the retry.
        let guard = self.guard.clone();
        let guarded = call.guarded.clone();
        let mut execution = tokio::spawn(async move { guard.execute(guarded, run).await });
        let execution = tokio::select! {
            done = &mut execution => done,
            () = cancel => {
                tracing::info!(route = %call.guarded.route, request_id = %jsonrpc::id_text(&call.id),
                    "the client cancelled its request: not answered; the call runs on");
                return cancelled_answer();
            }
        };
        let resp = match execution {
            Ok(execution) => self.answer(execution, &call, started),
            Err(e) => {
                tracing::error!(route = %call.guarded.route, error = %e, "guarded call task failed");
                return json_response(
                    StatusCode::OK,
                    &jsonrpc::error_message(&call.id, -32603, "oncely could not guard this call"),
                );
            }
        };
        match self.cancellation(session, &call.id) {
            Some(cancel) => resp.map(|body| UntilCancelled::new(body, cancel).boxed()),
            None => resp,
        }
    }

    /// Maps what the engine did to an MCP answer.
    fn answer(&self, execution: Execution, call: &Call, started: Instant) -> Response<McpBody> {
        match execution {
            Execution::Fresh(fresh) => {
                self.observe(
                    call,
                    &fresh.record,
                    "fresh",
                    Some(fresh.status.as_u16()),
                    started,
                );
                let mut resp = Response::new(fresh.body);
                *resp.status_mut() = fresh.status;
                *resp.headers_mut() = fresh.headers;
                mark(resp.headers_mut(), "fresh", &fresh.record);
                resp
            }
            Execution::Replayed(record) => self.replay(&record, "replayed", call, started),
            Execution::Joined(record) => self.replay(&record, "joined", call, started),
            Execution::InFlight {
                record,
                retry_after,
            } => self.in_flight(&record, retry_after, call, started),
            Execution::TooLarge(record) => {
                self.observe(call, &record, "too_large", None, started);
                respond(call, too_large_result(&call.tool, &record), &record)
            }
            Execution::OutcomeUnknown(record) => {
                self.observe(call, &record, "outcome_unknown", None, started);
                self.outcome_unknown(call, &record, false)
            }
            Execution::StoreUnavailable(why) => {
                tracing::error!(route = %call.guarded.route, error = %why,
                    "ledger unavailable: tools/call not forwarded");
                if let Some(mut span) = call.span.lock().expect("call span lock").take() {
                    span.set(attr::ROUTE, call.guarded.route.as_str());
                    span.set(attr::DECISION, "store_unavailable");
                    span.fail("the ledger cannot be reached");
                    span.end();
                }
                problem(
                    ProblemCode::StoreUnavailable,
                    "the ledger cannot be reached; the tool call was not forwarded",
                )
            }
            Execution::UpstreamFailed { record, failure } => {
                self.observe(call, &record, "fresh", None, started);
                if record.state == State::OutcomeUnknown {
                    tracing::warn!(route = %call.guarded.route, record = %record.id, failure = ?failure,
                        "action failed ambiguously: outcome_unknown");
                    return self.outcome_unknown(call, &record, true);
                }
                match failure {
                    UpstreamFailure::Unreachable(e) => {
                        tracing::warn!(route = %call.guarded.route, error = %e, "upstream unreachable");
                        problem(
                            ProblemCode::UpstreamUnreachable,
                            "the MCP server could not be reached",
                        )
                    }
                    UpstreamFailure::Lost(e) => {
                        tracing::warn!(route = %call.guarded.route, error = %e, "upstream failed");
                        problem(
                            ProblemCode::UpstreamFailed,
                            "the MCP server's answer broke off",
                        )
                    }
                    UpstreamFailure::Timeout => problem(
                        ProblemCode::UpstreamTimeout,
                        "the MCP server did not answer within timeout",
                    ),
                    UpstreamFailure::Busy => problem(
                        ProblemCode::UpstreamBusy,
                        "the MCP server's every slot stayed taken; the call was not sent",
                    ),
                }
            }
            // The key is the fingerprint, so a key is never reused with another one; and
            // anything a later engine adds is answered as an internal error, not forwarded.
            other => {
                tracing::error!(route = %call.guarded.route, execution = ?other, "unexpected execution");
                json_response(
                    StatusCode::OK,
                    &jsonrpc::error_message(&call.id, -32603, "oncely could not guard this call"),
                )
            }
        }
    }

    /// A guarded call of a client that declared the tasks extension: answered as usual
    /// when it ends within `wait`, else with a task whose id is the record's (the owner task
    /// runs on and records the call; duplicates get the same task).
    async fn guard_as_task<F>(
        self: Arc<Self>,
        call: Call,
        run: F,
        started: Instant,
    ) -> Response<McpBody>
    where
        F: FnOnce(
                DownstreamKey,
                &Record,
            ) -> BoxFuture<'static, Result<UpstreamResponse, UpstreamError>>
            + Send
            + 'static,
    {
        let deadline = Instant::now() + call.guarded.wait;
        let guard = self.guard.clone();
        let guarded = call.guarded.clone();
        // On a task of its own, so that giving up on it after `wait` abandons nothing.
        let mut execution = tokio::spawn(async move { guard.execute(guarded, run).await });
        let execution = match tokio::time::timeout_at(deadline, &mut execution).await {
            Ok(done) => done,
            Err(_) => {
                let store = self.guard.store();
                match store.lookup(&call.guarded.scope, &call.guarded.key).await {
                    Ok(Some(record)) if record.state == State::Processing => {
                        return self.task_created(&call, &record, started);
                    }
                    _ => execution.await,
                }
            }
        };
        let execution = match execution {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(route = %call.guarded.route, error = %e, "guarded call task failed");
                return json_response(
                    StatusCode::OK,
                    &jsonrpc::error_message(&call.id, -32603, "oncely could not guard this call"),
                );
            }
        };
        match execution {
            Execution::Fresh(fresh) => {
                // The whole answer within `wait`, or a task (dropping the body abandons
                // nothing: the owner task reads and records it all the same).
                match tokio::time::timeout_at(deadline, fresh.body.collect()).await {
                    Ok(Ok(collected)) => {
                        self.observe(
                            &call,
                            &fresh.record,
                            "fresh",
                            Some(fresh.status.as_u16()),
                            started,
                        );
                        let mut resp = Response::new(full(collected.to_bytes()));
                        *resp.status_mut() = fresh.status;
                        *resp.headers_mut() = fresh.headers;
                        mark(resp.headers_mut(), "fresh", &fresh.record);
                        resp
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(route = %call.guarded.route, error = %e, "upstream failed");
                        problem(
                            ProblemCode::UpstreamFailed,
                            "the MCP server's answer broke off",
                        )
                    }
                    Err(_) => self.task_created(&call, &fresh.record, started),
                }
            }
            Execution::InFlight { record, .. } => self.task_created(&call, &record, started),
            other => self.answer(other, &call, started),
        }
    }

    /// The `CreateTaskResult` for a guarded call still running after `wait`: the task of
    /// the record's current attempt.
    fn task_created(&self, call: &Call, record: &Record, started: Instant) -> Response<McpBody> {
        self.observe(call, record, "in_flight", None, started);
        let task = self.task(record, record.attempt, &call.tool, &TaskStatus::Working);
        let mut resp = json_response(
            StatusCode::OK,
            &jsonrpc::result_message(&call.id, tasks::create_task_result(task)),
        );
        mark(resp.headers_mut(), "in_flight", record);
        resp
    }

    /// `tasks/get`, `tasks/cancel` or `tasks/update` of the 2026-07-28 extension. Checked
    /// as the extension says (routing headers, the declared extension, a known task of
    /// this principal) before anything else; this endpoint's tasks (`rec_…`) are
    /// answered from the ledger, any other task id is the server's own and is forwarded.
    async fn task_request(
        self: Arc<Self>,
        parts: http::request::Parts,
        bytes: Bytes,
        message: Value,
    ) -> Response<McpBody> {
        let Some(request) = jsonrpc::as_request(&message) else {
            return self.forward(parts, bytes, Vec::new()).await;
        };
        let id = &request.id.clone();
        let method = request.method.to_string();
        if let Some(mismatch) = header_mismatch(&parts.headers, &message, TASK_ID) {
            return json_response(
                StatusCode::BAD_REQUEST,
                &jsonrpc::error_message(id, HEADER_MISMATCH, &mismatch),
            );
        }
        if !tasks::declares_tasks(request.params) {
            return json_response(
                StatusCode::OK,
                &jsonrpc::error_value(id, tasks::missing_capability_error()),
            );
        }
        let Some(task_id) = request
            .params
            .and_then(|p| p.get("taskId"))
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return task_not_found(id, "params.taskId is missing");
        };
        let Some((record_id, attempt)) = tasks::parse_task_id(&task_id) else {
            return self.forward_task_request(parts, bytes, id.clone()).await;
        };
        // Only the principal whose call it is reads a task.
        let principal = self
            .config
            .principal
            .make_principal(&RequestHead::of_parts(&parts))
            .map(|raw| self.guard.principal_hash(&raw));
        let Some(principal) = principal else {
            return task_not_found(id, "Task not found");
        };
        let store = self.guard.store();
        let read =
            match tokio::time::timeout(oncely_tower::STORE_ANSWER, store.get(&record_id)).await {
                Ok(read) => read.map_err(|e| e.to_string()),
                Err(_) => Err("the ledger did not answer in time".to_string()),
            };
        let record = match read {
            Ok(Some(record)) => record,
            Ok(None) => return task_not_found(id, "Task not found"),
            Err(e) => {
                tracing::error!(route = %self.config.path, error = %e, "ledger unavailable: {method}");
                return json_response(
                    StatusCode::OK,
                    &jsonrpc::error_message(id, -32603, "the ledger cannot be reached"),
                );
            }
        };
        let tool = record
            .route
            .strip_prefix(self.config.path.as_str())
            .and_then(|r| r.strip_prefix('#'));
        // Another principal's task is as unknown as one that never was.
        let (Some(tool), true) = (tool, record.principal == principal) else {
            return task_not_found(id, "Task not found");
        };
        let Some(status) = tasks::status_of(&record, attempt) else {
            return task_not_found(id, "Task not found");
        };
        let result = match method.as_str() {
            "tasks/get" => {
                let payload = self.task_payload(&record, tool, &status);
                let task = self.task(&record, attempt, tool, &status);
                tasks::get_task_result(task, payload)
            }
            "tasks/cancel" => {
                tracing::info!(route = %record.route, record = %record.id, attempt,
                    "tasks/cancel acknowledged: the shared execution runs on");
                tasks::acknowledgement()
            }
            "tasks/update" => {
                // A guarded call asks for no input through its task: every inputResponses
                // key is one that is not outstanding, and is ignored.
                tasks::acknowledgement()
            }
            other => {
                return json_response(
                    StatusCode::OK,
                    &jsonrpc::error_message(id, -32601, &format!("Method not found: {other}")),
                )
            }
        };
        json_response(StatusCode::OK, &jsonrpc::result_message(id, result))
    }

    /// A `tasks/*` request naming a task that is not one of oncely's: the server's own. Its
    /// answer passes back, except that a server that does not know the task, or does not
    /// speak the extension at all (HTTP 404/405, JSON-RPC -32601), is answered -32602 as
    /// the extension requires.
    async fn forward_task_request(
        self: Arc<Self>,
        parts: http::request::Parts,
        bytes: Bytes,
        id: Value,
    ) -> Response<McpBody> {
        let resp = self.forward(parts, bytes, Vec::new()).await;
        let status = resp.status();
        let (rparts, body) = resp.into_parts();
        let Some(bytes) = collect_limited(body, EDIT_LIMIT).await else {
            return json_response(
                StatusCode::OK,
                &jsonrpc::error_message(&id, -32603, "the MCP server's answer broke off"),
            );
        };
        let unknown_method = messages_in(&rparts.headers, &bytes).iter().any(|m| {
            matches!(jsonrpc::response_to(m, &id), Some(Outcome::Error(e)) if e.get("code") == Some(&json!(-32601)))
        });
        let not_served = matches!(status.as_u16(), 404 | 405 | 501);
        if unknown_method || not_served {
            return task_not_found(&id, "Task not found");
        }
        Response::from_parts(rparts, full(bytes))
    }

    /// How long a task of this endpoint can be read: while its call may run, then for the
    /// replay window.
    fn task_ttl_ms(&self) -> u64 {
        (self.config.timeout + self.config.window).as_millis() as u64
    }

    /// How often a client is asked to poll a task.
    fn task_poll_ms(&self) -> u64 {
        (self.config.wait / 4)
            .clamp(Duration::from_millis(250), Duration::from_secs(5))
            .as_millis() as u64
    }

    /// The `Task` of attempt `attempt` of `record`, in `status`. A terminal task's members
    /// depend only on how it ended, so that it never changes.
    fn task(&self, record: &Record, attempt: u32, tool: &str, status: &TaskStatus) -> Value {
        let started = record.created_at.to_rfc3339();
        let (name, message, updated) = match status {
            TaskStatus::Working => (
                "working",
                format!(
                    "The call of `{tool}` is running (started at {started}). oncely runs it once \
                     for every caller with these arguments: poll tasks/get for its result. \
                     tasks/cancel never cancels the shared execution."
                ),
                record.updated_at.to_rfc3339(),
            ),
            TaskStatus::Unknown => (
                "working",
                format!(
                    "The call of `{tool}` was sent, but its answer was lost, so it is unknown \
                     whether it took effect. It will not run again by itself: an operator \
                     reconciles it (`oncely ledger resolve {}`), then this task ends.",
                    record.id
                ),
                record.updated_at.to_rfc3339(),
            ),
            TaskStatus::Completed => (
                "completed",
                format!("The call of `{tool}` completed."),
                record
                    .completed_at
                    .unwrap_or(record.updated_at)
                    .to_rfc3339(),
            ),
            TaskStatus::Failed(failure) => {
                let code = failure.error.get("code").and_then(Value::as_i64);
                (
                    "failed",
                    format!(
                        "The call of `{tool}` failed with JSON-RPC error {}; nothing was \
                         stored, so calling it again runs it again (as a new task).",
                        code.unwrap_or(-32603)
                    ),
                    failure.at.clone(),
                )
            }
        };
        tasks::task(
            &tasks::task_id(&record.id, attempt),
            name,
            &message,
            &started,
            &updated,
            self.task_ttl_ms(),
            self.task_poll_ms(),
        )
    }

    /// What a `GetTaskResult` carries besides the task: the tool result of a completed
    /// task, the JSON-RPC error of a failed one.
    fn task_payload(
        &self,
        record: &Record,
        tool: &str,
        status: &TaskStatus,
    ) -> Option<(&'static str, Value)> {
        match status {
            TaskStatus::Working | TaskStatus::Unknown => None,
            TaskStatus::Completed => {
                let stored = record
                    .response
                    .as_ref()
                    .and_then(|r| r.body.as_deref())
                    .and_then(|b| serde_json::from_slice::<Value>(b).ok());
                let mut result = stored.unwrap_or_else(|| too_large_result(tool, record));
                for_revision(&mut result, true);
                Some(("result", result))
            }
            TaskStatus::Failed(failure) => Some(("error", failure.error.clone())),
        }
    }

    fn replay(
        &self,
        record: &Record,
        kind: &'static str,
        call: &Call,
        started: Instant,
    ) -> Response<McpBody> {
        let stored = record
            .response
            .as_ref()
            .and_then(|r| r.body.as_deref())
            .and_then(|b| serde_json::from_slice::<Value>(b).ok());
        let Some(mut result) = stored else {
            tracing::error!(record = %record.id, "a stored tool result is not JSON");
            return json_response(
                StatusCode::OK,
                &jsonrpc::error_message(&call.id, -32603, "the stored tool result is unreadable"),
            );
        };
        if result.get("resultType").and_then(Value::as_str) == Some("task") && !call.tasks {
            // The original became a task on the server; this client did not declare the
            // extension, so it must not get a task (and the tool does not run again).
            let text = format!(
                "The earlier call of `{tool}` with these arguments is a task on the server (task \
                 {task}), which this client cannot follow: it did not declare the \
                 io.modelcontextprotocol/tasks extension. The tool will not run again for these \
                 arguments until the replay window ends; call it from a client that supports \
                 tasks to follow it.",
                tool = call.tool,
                task = result.get("taskId").and_then(Value::as_str).unwrap_or("?"),
            );
            self.observe(call, record, kind, None, started);
            return tool_error(
                call,
                &text,
                json!({"status": kind, "original_at": record.created_at.to_rfc3339(), "record": record.id.as_str()}),
                record,
            );
        }
        jsonrpc::set_meta(
            &mut result,
            REPLAY_META_KEY,
            json!({"status": kind, "original_at": record.created_at.to_rfc3339(), "record": record.id.as_str()}),
        );
        for_revision(&mut result, call.modern);
        self.observe(call, record, kind, None, started);
        let mut resp = json_response(StatusCode::OK, &jsonrpc::result_message(&call.id, result));
        mark(resp.headers_mut(), kind, record);
        resp.headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        resp
    }

    /// The `isError` result for a call whose record awaits reconciliation: `first` when
    /// this caller's own call just failed ambiguously, else a duplicate of such a call.
    fn outcome_unknown(&self, call: &Call, record: &Record, first: bool) -> Response<McpBody> {
        respond(
            call,
            outcome_unknown_result(&call.tool, record, first),
            record,
        )
    }

    fn in_flight(
        &self,
        record: &Record,
        retry_after: Duration,
        call: &Call,
        started: Instant,
    ) -> Response<McpBody> {
        let after = retry_after.as_secs().max(1);
        let text = format!(
            "The original call of `{tool}` with these arguments is still running (it started at \
             {at}). It will not run twice. Call `{tool}` again with the same arguments after \
             {after} second{s} to receive its result.",
            tool = call.tool,
            at = record.created_at.to_rfc3339(),
            s = if after == 1 { "" } else { "s" },
        );
        self.observe(call, record, "in_flight", None, started);
        let mut resp = tool_error(
            call,
            &text,
            json!({"status": "in_flight", "original_at": record.created_at.to_rfc3339(), "retry_after": after}),
            record,
        );
        resp.headers_mut()
            .insert("retry-after", HeaderValue::from(after));
        resp
    }

    fn observe(
        &self,
        call: &Call,
        record: &Record,
        status: &'static str,
        upstream_status: Option<u16>,
        started: Instant,
    ) {
        let span = call.span.lock().expect("call span lock").take();
        if let Some(mut span) = span {
            span.set(attr::ROUTE, call.guarded.route.as_str());
            span.set(attr::DECISION, status);
            span.set(attr::RECORD, record.id.as_str());
            span.set(attr::ATTEMPT, i64::from(record.attempt));
            span.set(attr::PRINCIPAL, call.guarded.principal.as_str());
            if let Some(upstream) = upstream_status {
                span.set(attr::UPSTREAM_STATUS, i64::from(upstream));
            }
            if let Some(workflow) = &call.guarded.workflow_id {
                span.set(attr::WORKFLOW_ID, workflow.as_str());
            }
            span.end();
        }
        // Labels are bounded: a tool no listing or config named counts as `other`.
        let tool = self.catalog.metric_label(&self.config.tools, &call.tool);
        RequestLine {
            record: Some(record.id.as_str()),
            route: call.guarded.route.as_str(),
            principal: Some(call.guarded.principal.as_str()),
            status,
            attempt: Some(record.attempt),
            workflow_id: record.workflow_id.as_deref(),
            upstream_status,
            provider_request_id: None,
            duration_ms: started.elapsed().as_millis() as u64,
            tool: Some(call.tool.as_str()),
        }
        .emit_counted_as(
            "mcp tools/call",
            Counted {
                route: &self.config.route_of(tool),
                tool,
            },
        );
    }
}

/// The owner's upstream call of a guarded `tools/call`, as the engine runs it once it owns
/// the claimed record: the call forwarded with the downstream key, its answer classified
/// for the record (with the attempt and what earlier attempts left in it).
fn owner_call(
    me: Arc<Inner>,
    parts: http::request::Parts,
    bytes: Bytes,
    id: Value,
    parent: Option<oncely_tower::trace::SpanParent>,
    owner_tracked: Tracked,
) -> impl FnOnce(DownstreamKey, &Record) -> BoxFuture<'static, Result<UpstreamResponse, UpstreamError>>
       + Send
       + 'static {
    let upstream = me.upstream.clone();
    move |downstream: DownstreamKey,
          claimed: &Record|
          -> BoxFuture<'static, Result<UpstreamResponse, UpstreamError>> {
        // The derived downstream key reaches the server, so that it can deduplicate too.
        let bytes = forwarded_call(&bytes, downstream.as_str());
        let (attempt, history) = (claimed.attempt, History::of(claimed));
        let mut req = me.upstream_request(&parts, bytes);
        // The owner holds the endpoint's slot and times the call: the upstream does neither.
        req.extensions_mut().insert(OwnerSend);
        let span = parent.map(|p| p.upstream_call(req.headers_mut(), &parts.method));
        async move {
            let resp = match send(upstream, req).await {
                Ok(resp) => {
                    if let Some(span) = span {
                        span.answered(resp.status().as_u16());
                    }
                    resp
                }
                Err(e) => {
                    let e = oncely_tower::upstream_error(e);
                    if let Some(span) = span {
                        span.failed(e.to_string());
                    }
                    return Err(e);
                }
            };
            let (parts, body) = resp.into_parts();
            // A break-off after the answer began is a stream end: never a release.
            let body = BreakAsEnd::new(body).map_err(BoxError::from).boxed();
            Ok(UpstreamResponse::new(parts.status, parts.headers, body)
                .with_classifier(classifier(id, attempt, history, owner_tracked)))
        }
        .boxed()
    }
}

/// `req` sent through `upstream`. A boxed future, not an `async` block holding the
/// service's: rustc cannot prove that one `Send` for every lifetime of the boxed error
/// type (rust-lang/rust#64552).
fn send(
    upstream: McpUpstream,
    req: Request<BoxBody>,
) -> BoxFuture<'static, Result<Response<BoxBody>, BoxError>> {
    Box::pin(upstream.oneshot(req))
}

/// What the ledger keeps of a guarded call's answer, decided once the owner task has read
/// it whole: the `result` for `id` (stored as a JSON body), or nothing (released) for an
/// HTTP error, a JSON-RPC error, an `input_required` result, or no response at all.
/// `attempt` is the claimed attempt and `history` the failures of earlier ones, carried on
/// in the record (see [`crate::tasks`]). `tracked` keeps the call's cancellations dropped
/// until the owner task is done with it.
fn classifier(id: Value, attempt: u32, history: History, tracked: Tracked) -> Classifier {
    Box::new(move |status, headers, body| {
        let _tracked = tracked;
        let failed = |reason: String, error: Value| {
            Classified::Release(history.clone().with(attempt, error).reason(&reason))
        };
        if !status.is_success() {
            let reason = format!("no tool result (HTTP {})", status.as_u16());
            return failed(reason.clone(), tasks::internal_error(&reason));
        }
        let outcome = messages_in(headers, body)
            .iter()
            .find_map(|m| jsonrpc::response_to(m, &id));
        match outcome {
            // The server asks for input (2026-07-28): nothing happened yet. The continuation
            // that answers it is a call of its own, and the one that executes.
            Some(Outcome::Result(result))
                if result.get("resultType").and_then(Value::as_str) == Some("input_required") =>
            {
                Classified::Release(history.reason(INPUT_REQUIRED))
            }
            Some(Outcome::Result(result)) => {
                let mut headers = vec![("content-type".into(), "application/json".into())];
                if !history.0.is_empty() {
                    headers.push((tasks::HISTORY_HEADER.into(), history.to_text()));
                }
                Classified::Store(StoredResponse {
                    status: 200,
                    headers,
                    body: Some(serde_json::to_vec(&result).unwrap_or_default().into()),
                })
            }
            Some(Outcome::Error(e)) => failed(format!("JSON-RPC error (not stored): {e}"), e),
            // The call was sent and the answer ended without its response: it may have run
            // (a server that ended its session aborts it mid-way). Never released.
            None => {
                Classified::Unknown(history.reason(
                    "the answer ended without the call's JSON-RPC response: it may have run",
                ))
            }
        }
    })
}

/// Why a call answered `input_required` is released.
const INPUT_REQUIRED: &str = "the server asked for input (input_required): not stored; the \
    continuation that answers it is a call of its own";

/// A whole body of at most `limit` bytes; `None` when it is larger or breaks off.
async fn collect_limited(mut body: McpBody, limit: usize) -> Option<Bytes> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.ok()?.into_data() {
            if out.len() + data.len() > limit {
                return None;
            }
            out.extend_from_slice(&data);
        }
    }
    Some(out.into())
}

/// The refusal of a `tools/call` that oncely cannot read as one call to guard, so that no
/// spelling of a call passes unguarded: one that repeats a member name (servers disagree
/// on which value counts), one without a usable id (a notification, or `"id": null`),
/// and one whose `params` is not an object with a string `name`. `None` for any other
/// message.
fn unreadable_call(message: &Value, text: &str) -> Option<Value> {
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        return None;
    }
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let refuse = |code, why: &str| Some(jsonrpc::error_message(&id, code, why));
    if oncely_core::canon::Json::parse(text.as_bytes()).is_none() {
        return refuse(INVALID_REQUEST, REPEATED_NAME);
    }
    if !matches!(id, Value::String(_) | Value::Number(_)) {
        return refuse(
            INVALID_REQUEST,
            "a tools/call needs a string or number id (oncely guards requests, not notifications)",
        );
    }
    if ToolCall::read(message, text).is_none() {
        return refuse(
            tasks::INVALID_PARAMS,
            "a tools/call needs params with a string name",
        );
    }
    None
}

/// The -32602 a `tasks/*` request gets for a task it cannot have: unknown, expired, or
/// another principal's (told apart from none of them).
fn task_not_found(id: &Value, why: &str) -> Response<McpBody> {
    json_response(
        StatusCode::OK,
        &jsonrpc::error_message(
            id,
            tasks::INVALID_PARAMS,
            &format!("Failed to retrieve task: {why}"),
        ),
    )
}

/// Whether oncely edits an answer it passes through, and how (see [`Inner::editor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A `tools/list` result: learnt from; guarded tools offer no task-augmented calls.
    ToolsList,
    /// A `server/discover` result: the tasks extension is advertised.
    Discover,
}

/// Adds `capabilities.extensions["io.modelcontextprotocol/tasks"]` to a `server/discover`
/// result: oncely answers tasks for the calls it guards, whatever the server speaks.
fn advertise_tasks(result: &mut Value) -> bool {
    let Some(obj) = result.as_object_mut() else {
        return false;
    };
    let object = || Value::Object(Default::default());
    let capabilities = obj.entry("capabilities").or_insert_with(object);
    let Some(capabilities) = capabilities.as_object_mut() else {
        return false;
    };
    let extensions = capabilities.entry("extensions").or_insert_with(object);
    match extensions.as_object_mut() {
        Some(e) if !e.contains_key(tasks::TASKS_EXTENSION) => {
            e.insert(tasks::TASKS_EXTENSION.into(), object());
            true
        }
        _ => false,
    }
}

/// The JSON-RPC messages of a whole answer body: one message, a batch, or an event stream.
fn messages_in(headers: &HeaderMap, body: &[u8]) -> Vec<Value> {
    let is_sse = header_str(headers, "content-type")
        .is_some_and(|c| c.to_ascii_lowercase().starts_with("text/event-stream"));
    if is_sse {
        let mut parser = sse::Parser::new(body.len() + 1);
        let mut events = parser.feed(body);
        events.extend(parser.feed(b"\n\n"));
        return events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
            .collect();
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(items)) => items,
        Ok(v) => vec![v],
        Err(_) => Vec::new(),
    }
}

/// Reads a whole answer and returns the responses to `ids` in it; an id without one gets a
/// JSON-RPC error that says why (for answers joined into a batch).
async fn responses_of(resp: Response<McpBody>, ids: &[Value]) -> Vec<Value> {
    let status = resp.status();
    let (parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let messages = messages_in(&parts.headers, &bytes);
    ids.iter()
        .map(|id| {
            messages
                .iter()
                .find(|m| {
                    m.get("id") == Some(id)
                        && !m.as_object().is_some_and(|o| o.contains_key("method"))
                })
                .cloned()
                .unwrap_or_else(|| {
                    jsonrpc::error_message(
                        id,
                        -32603,
                        &format!(
                            "no response (HTTP {}): {}",
                            status.as_u16(),
                            String::from_utf8_lossy(&bytes)
                        ),
                    )
                })
        })
        .collect()
}

/// Whether a request is of the stateless era (2026-07-28 or later): its
/// `MCP-Protocol-Version` names a revision without the initialize handshake.
fn is_modern(headers: &HeaderMap) -> bool {
    header_str(headers, "mcp-protocol-version").is_some_and(|v| !HANDSHAKE_VERSIONS.contains(&v))
}

/// Makes a complete result oncely writes (or replays) valid for the revision: 2026-07-28
/// results carry `resultType` (`"complete"`); earlier revisions have no such member.
fn for_revision(result: &mut Value, modern: bool) {
    let Some(obj) = result.as_object_mut() else {
        return;
    };
    if modern {
        obj.entry("resultType")
            .or_insert_with(|| Value::String("complete".into()));
    } else if obj.get("resultType").and_then(Value::as_str) == Some("complete") {
        obj.remove("resultType");
    }
}

/// The guarded call's request body as forwarded ([`jsonrpc::forwarded_call`]: the
/// downstream key in `_meta`, no `task`); the body as it came when it is not a JSON-RPC
/// request with object params. The arguments reach the server as the caller wrote them.
fn forwarded_call(body: &Bytes, key: &str) -> Bytes {
    std::str::from_utf8(body)
        .ok()
        .and_then(|text| jsonrpc::forwarded_call(text, key))
        .map(Bytes::from)
        .unwrap_or_else(|| body.clone())
}

/// Where a request's `Mcp-Name` is in its body: a tool's name.
const NAME: (&str, &str) = ("/params/name", "tool name");

/// Where a request's `Mcp-Name` is in its body: a task's id.
const TASK_ID: (&str, &str) = ("/params/taskId", "taskId");

/// For the stateless era: the routing headers of a request must match its body
/// (`Mcp-Method` its method, `Mcp-Name` the member `name` points to, and the
/// `MCP-Protocol-Version` its `_meta` protocol version).
fn header_mismatch(headers: &HeaderMap, message: &Value, name: (&str, &str)) -> Option<String> {
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
        let got = header_str(headers, &header.to_ascii_lowercase());
        match got {
            Some(got) if got == want => None,
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

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn mark(headers: &mut HeaderMap, status: &str, record: &Record) {
    if let Ok(v) = HeaderValue::from_str(status) {
        headers.insert(ONCELY_STATUS, v);
    }
    if let Ok(v) = HeaderValue::from_str(record.id.as_str()) {
        headers.insert(ONCELY_RECORD, v);
    }
    if status == "fresh" {
        headers.remove(http::header::CONTENT_LENGTH);
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<McpBody> {
    let mut resp = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A tool result with `isError: true` and one text, marked with `_meta`.
fn error_result(text: &str, meta: Value) -> Value {
    let mut result = json!({"content": [{"type": "text", "text": text}], "isError": true});
    jsonrpc::set_meta(&mut result, REPLAY_META_KEY, meta);
    result
}

/// The result for a duplicate of a call whose result was too large to keep.
fn too_large_result(tool: &str, record: &Record) -> Value {
    let text = format!(
        "The earlier call of `{tool}` with these arguments completed at {at}, but its result \
         was larger than the gateway keeps, so it cannot be shown again. The tool ran once and \
         will not run again for these arguments until its replay window ends ({until}). Do not \
         retry it; tell the user the result was too large to return twice.",
        at = record
            .completed_at
            .unwrap_or(record.created_at)
            .to_rfc3339(),
        until = record
            .expires_at
            .map(|t| t.to_rfc3339())
            .unwrap_or_default(),
    );
    error_result(
        &text,
        json!({"status": "result_too_large", "original_at": record.created_at.to_rfc3339()}),
    )
}

/// The result for a call whose record awaits reconciliation: `first` when this caller's
/// own call just failed ambiguously, else a duplicate of such a call.
fn outcome_unknown_result(tool: &str, record: &Record, first: bool) -> Value {
    let what = if first {
        format!(
            "The call of `{tool}` was sent, but its answer was lost (the connection failed or \
             it timed out), so it is unknown whether it took effect."
        )
    } else {
        format!(
            "An earlier call of `{tool}` with these arguments (started at {at}) was sent, but \
             its answer was lost, so it is unknown whether it took effect.",
            at = record.created_at.to_rfc3339()
        )
    };
    let text = format!(
        "{what} It will not be run again automatically: do not retry it. Tell the user the \
         outcome must be checked; an operator reconciles it with `oncely ledger resolve {id} \
         --released` if it did not happen (then the same call runs again), or `oncely ledger \
         resolve {id} --completed --status 200 --body-file RESULT.json` if it did.",
        id = record.id
    );
    error_result(
        &text,
        json!({"status": "outcome_unknown", "original_at": record.created_at.to_rfc3339(), "record": record.id.as_str()}),
    )
}

/// A tool result with `isError: true` and one text, marked with `_meta`, as the call's
/// protocol revision writes it.
fn tool_error(call: &Call, text: &str, meta: Value, record: &Record) -> Response<McpBody> {
    respond(call, error_result(text, meta), record)
}

/// Answers `call` with `result`, as the call's protocol revision writes it.
fn respond(call: &Call, mut result: Value, record: &Record) -> Response<McpBody> {
    for_revision(&mut result, call.modern);
    let mut resp = json_response(StatusCode::OK, &jsonrpc::result_message(&call.id, result));
    if let Ok(v) = HeaderValue::from_str(record.id.as_str()) {
        resp.headers_mut().insert(ONCELY_RECORD, v);
    }
    resp
}

/// A problem+json answer (the one renderer, `oncely_http::problem`).
fn problem(code: ProblemCode, detail: &str) -> Response<McpBody> {
    Problem::new(code, detail).into_response()
}

/// The answer to a request its client cancelled: an event stream without the response.
fn cancelled_answer() -> Response<McpBody> {
    let mut resp = Response::new(full(Bytes::new()));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    resp
}

fn empty(status: StatusCode) -> Response<McpBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

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
