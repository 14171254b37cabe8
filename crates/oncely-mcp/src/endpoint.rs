//! The HTTP service of one `[[mcp]]` endpoint.
//!
//! Every request is forwarded to the upstream MCP server unchanged and its answer streamed
//! back frame by frame, except:
//! - a guarded `tools/call` (see [`crate::catalog`]): claimed on the ledger, then executed
//!   by a task the client's connection does not own, replayed, joined, or answered with an
//!   `isError` result that says the original still runs;
//! - a `notifications/cancelled` naming a guarded call in flight: acknowledged with 202 and
//!   dropped, so the client's timeout never abandons the paid work upstream;
//! - a `tools/list` answer: passed through, and read on the way to learn which tools are
//!   read-only.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oncely_core::{
    ClaimSpec, Class, Completion, FingerprintBuilder, Record, Scope, StoredResponse, Timestamp,
};
use oncely_store::Store;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::body::{full, ChannelBody, McpBody, Tap};
use crate::catalog::ToolCatalog;
use crate::config::{McpConfig, PrincipalSource};
use crate::jsonrpc::{self, Outcome, CONTINUATION_PARAMS, REPLAY_META_KEY};
use crate::ledger::{self, Decision, ReplayKind};
use crate::principal::PrincipalHasher;
use crate::sse;
use crate::{BoxError, McpError};

/// The pooled HTTP client the endpoint forwards with (the gateway's proxy uses the same).
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// JSON-RPC error code of MCP 2026-07-28 for routing headers that disagree with the body.
pub const HEADER_MISMATCH: i64 = -32020;

/// Protocol revisions that use the initialize handshake and sessions; any later one is
/// the stateless era (2026-07-28), whose routing headers must match the body.
const HANDSHAKE_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

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
    store: Arc<dyn Store>,
    client: UpstreamClient,
    catalog: ToolCatalog,
    hasher: PrincipalHasher,
    instance: String,
    /// Guarded calls this endpoint is answering now, by (session, request id): their
    /// cancellations are dropped.
    guarded: Mutex<HashMap<(Option<String>, String), usize>>,
}

impl McpEndpoint {
    /// A pooled HTTP/1.1 client for the upstream.
    pub fn default_client() -> UpstreamClient {
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build_http()
    }

    /// Builds the endpoint for `config` on `store` (from which it takes the secret that
    /// principals are hashed with), forwarding with `client`.
    pub async fn new(
        config: McpConfig,
        store: Arc<dyn Store>,
        client: UpstreamClient,
    ) -> Result<McpEndpoint, McpError> {
        let secret = store.secret("principal").await?;
        Ok(McpEndpoint {
            inner: Arc::new(Inner {
                config,
                store,
                client,
                catalog: ToolCatalog::new(),
                hasher: PrincipalHasher::new(secret),
                instance: format!("mcp-{}", uuid::Uuid::now_v7().simple()),
                guarded: Mutex::new(HashMap::new()),
            }),
        })
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

/// Removes a guarded call from the cancellation filter when dropped.
struct Tracked {
    inner: Arc<Inner>,
    key: (Option<String>, String),
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut map = self.inner.guarded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// One guarded call, as read from its request.
struct Call {
    id: Value,
    tool: String,
    route: String,
    principal: String,
    units: u64,
    spec: ClaimSpec,
}

impl Inner {
    async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<McpBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = req.into_parts();
        let bytes = match Limited::new(body, self.config.max_body).collect().await {
            Ok(c) => c.to_bytes(),
            Err(e) => {
                let too_large = e
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some();
                return if too_large {
                    problem(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "body_too_large",
                        "the request body is over max_body",
                    )
                } else {
                    problem(
                        StatusCode::BAD_REQUEST,
                        "body_unreadable",
                        "the request body could not be read",
                    )
                };
            }
        };
        if parts.method != Method::POST {
            return self.forward(parts, bytes, false).await;
        }
        let session = header_str(&parts.headers, "mcp-session-id").map(str::to_string);
        let mut learn = false;
        let mut bytes = bytes;
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(message @ Value::Object(_)) => {
                if let Some(target) = jsonrpc::cancelled_request_id(&message) {
                    if self.is_guarded_in_flight(&session, &target) {
                        tracing::info!(route = %self.config.path, request_id = %target,
                            "dropped a cancellation of a guarded tools/call: the call runs to its end");
                        return empty(StatusCode::ACCEPTED);
                    }
                }
                if let Some(request) = jsonrpc::as_request(&message) {
                    match request.method {
                        "tools/call" => {
                            if let Some(resp) =
                                self.clone().guard(&parts, &bytes, &message, &session).await
                            {
                                return resp;
                            }
                        }
                        "tools/list" => learn = true,
                        _ => {}
                    }
                }
            }
            Ok(Value::Array(items)) => {
                // A batch (2025-03-26): its tools/calls pass unguarded; cancellations of
                // guarded calls are taken out.
                let kept: Vec<&Value> = items
                    .iter()
                    .filter(|m| {
                        !jsonrpc::cancelled_request_id(m)
                            .is_some_and(|id| self.is_guarded_in_flight(&session, &id))
                    })
                    .collect();
                if kept.is_empty() {
                    return empty(StatusCode::ACCEPTED);
                }
                if kept.len() != items.len() {
                    bytes = Bytes::from(serde_json::to_vec(&kept).unwrap_or_default());
                }
                learn = kept
                    .iter()
                    .any(|m| jsonrpc::as_request(m).is_some_and(|r| r.method == "tools/list"));
            }
            _ => {}
        }
        self.forward(parts, bytes, learn).await
    }

    fn is_guarded_in_flight(&self, session: &Option<String>, id: &str) -> bool {
        let map = self.guarded.lock().unwrap_or_else(|e| e.into_inner());
        map.contains_key(&(session.clone(), id.to_string()))
    }

    fn track(self: &Arc<Self>, session: &Option<String>, id: &Value) -> Tracked {
        let key = (session.clone(), jsonrpc::id_text(id));
        *self
            .guarded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_insert(0) += 1;
        Tracked {
            inner: self.clone(),
            key,
        }
    }

    /// The upstream request for `parts` with `body`.
    fn upstream_request(&self, parts: &http::request::Parts, body: Bytes) -> Request<Full<Bytes>> {
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
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = strip_hop_by_hop(&parts.headers);
        req
    }

    /// Forwards unchanged and streams the answer back; `learn` reads a tools/list answer.
    async fn forward(
        self: Arc<Self>,
        parts: http::request::Parts,
        body: Bytes,
        learn: bool,
    ) -> Response<McpBody> {
        let req = self.upstream_request(&parts, body);
        let resp = match self.client.request(req).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(route = %self.config.path, error = %e, "upstream unreachable");
                return problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream_unreachable",
                    "the MCP server could not be reached",
                );
            }
        };
        let (mut rparts, body) = resp.into_parts();
        rparts.headers = strip_response_hop_by_hop(&rparts.headers);
        let body = body.map_err(BoxError::from);
        let body: McpBody = if learn {
            let me = self.clone();
            let is_sse = header_str(&rparts.headers, "content-type")
                .is_some_and(|c| c.to_ascii_lowercase().starts_with("text/event-stream"));
            Tap::new(body, is_sse, 8 << 20, move |seen: &[u8]| {
                me.catalog.observe_body(seen)
            })
            .boxed()
        } else {
            body.boxed()
        };
        Response::from_parts(rparts, body)
    }

    /// The principal's keyed hash, or `None` when the call is not to be guarded.
    fn principal(&self, headers: &HeaderMap) -> Option<String> {
        match &self.config.principal {
            PrincipalSource::None => Some(self.hasher.hash("none", b"")),
            PrincipalSource::Header(name) => headers
                .get(name)
                .map(|v| self.hasher.hash(&format!("header:{name}"), v.as_bytes())),
            PrincipalSource::Jwt(verifier) => {
                let token = header_str(headers, "authorization")?;
                let token = token
                    .strip_prefix("Bearer ")
                    .or_else(|| token.strip_prefix("bearer "))?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0);
                match verifier.verify(token.trim(), now) {
                    Ok(claim) => Some(
                        self.hasher
                            .hash(&format!("jwt:{}", verifier.claim()), claim.as_bytes()),
                    ),
                    Err(e) => {
                        tracing::info!(route = %self.config.path, reason = %e,
                            "unverifiable token: tools/call forwarded unguarded");
                        None
                    }
                }
            }
        }
    }

    /// Reads a guarded call, or `None` when it is forwarded as it is.
    fn read_call(&self, parts: &http::request::Parts, message: &Value) -> Option<Call> {
        let request = jsonrpc::as_request(message)?;
        let params = request.params?;
        let tool = params.get("name")?.as_str()?;
        if !self.catalog.is_guarded(&self.config.tools, tool) {
            return None;
        }
        if CONTINUATION_PARAMS.iter().any(|k| params.get(*k).is_some()) {
            return None;
        }
        let principal = self.principal(&parts.headers)?;
        let mut arguments = params
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let units = self.config.units.units(&arguments);
        let fingerprint = FingerprintBuilder::new(&principal, "tools/call", &self.config.path)
            .component(tool.as_bytes())
            .json(&mut arguments, &[]);
        let route = self.config.route_of(tool);
        let spec = ClaimSpec {
            scope: Scope::new(&principal, &route),
            key: fingerprint.to_hex(),
            fingerprint,
            class: Class::Write,
            route: route.clone(),
            principal: principal.clone(),
            owner: format!("{}-{}", self.instance, uuid::Uuid::now_v7().simple()),
            lease: self.config.lease,
            workflow_id: workflow_id(&parts.headers),
        };
        Some(Call {
            id: request.id.clone(),
            tool: tool.to_string(),
            route,
            principal,
            units,
            spec,
        })
    }

    /// A guarded tools/call, or `None` to forward it unguarded.
    async fn guard(
        self: Arc<Self>,
        parts: &http::request::Parts,
        bytes: &Bytes,
        message: &Value,
        session: &Option<String>,
    ) -> Option<Response<McpBody>> {
        let started = Instant::now();
        if let Some(mismatch) = header_mismatch(&parts.headers, message) {
            let id = message.get("id").cloned().unwrap_or(Value::Null);
            return Some(json_response(
                StatusCode::BAD_REQUEST,
                &jsonrpc::error_message(&id, HEADER_MISMATCH, &mismatch),
                &[],
            ));
        }
        let call = self.read_call(parts, message)?;
        let tracked = self.track(session, &call.id);
        let decision = match ledger::decide(&*self.store, &call.spec, self.config.wait).await {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(route = %call.route, error = %e, "ledger unavailable: tools/call not forwarded");
                return Some(problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the ledger cannot be reached; the tool call was not forwarded",
                ));
            }
        };
        Some(match decision {
            Decision::Owner(record) => {
                self.execute(parts, bytes.clone(), record, call, tracked, started)
                    .await
            }
            Decision::Replay(record, kind) => self.replay(&record, kind, &call, started).await,
            Decision::InFlight(record) => self.in_flight(&record, &call, started),
            Decision::OutcomeUnknown(record) => {
                let text = format!(
                    "An earlier call of `{}` with these arguments may or may not have completed; \
                     it is awaiting reconciliation (ledger record {}). It will not be run again \
                     automatically.",
                    call.tool, record.id
                );
                self.observe(&call, &record, "outcome_unknown", None, started);
                tool_error(
                    &call.id,
                    &text,
                    json!({"status": "outcome_unknown", "original_at": record.created_at.to_rfc3339()}),
                    &record,
                )
            }
        })
    }

    /// Runs the call upstream on a task of its own and streams its answer to this client
    /// while it stays; the task stores the result whether or not the client is still there.
    async fn execute(
        self: Arc<Self>,
        parts: &http::request::Parts,
        body: Bytes,
        record: Record,
        call: Call,
        tracked: Tracked,
        started: Instant,
    ) -> Response<McpBody> {
        let (head_tx, head_rx) = oneshot::channel();
        let req = self.upstream_request(parts, body);
        tokio::spawn(self.run_owned(req, record, call, tracked, head_tx, started));
        head_rx.await.unwrap_or_else(|_| {
            problem(
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                "the tool call could not be forwarded",
            )
        })
    }

    async fn run_owned(
        self: Arc<Self>,
        req: Request<Full<Bytes>>,
        record: Record,
        call: Call,
        tracked: Tracked,
        head_tx: oneshot::Sender<Response<McpBody>>,
        started: Instant,
    ) {
        let _tracked = tracked;
        let Some(fence) = record.fence() else { return };
        let renewer = {
            let store = self.store.clone();
            let fence = fence.clone();
            let lease = self.config.lease;
            tokio::spawn(async move {
                let every = (lease / 3).max(Duration::from_millis(100));
                loop {
                    tokio::time::sleep(every).await;
                    if store.renew(&fence, lease).await.is_err() {
                        break;
                    }
                }
            })
        };
        let deadline = Instant::now() + self.config.timeout;
        let upstream_started = Instant::now();
        let resp = match tokio::time::timeout_at(deadline, self.client.request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                renewer.abort();
                let _ = self
                    .store
                    .release(&fence, Some(format!("upstream unreachable: {e}")))
                    .await;
                self.observe(&call, &record, "fresh", None, started);
                let _ = head_tx.send(problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream_unreachable",
                    "the MCP server could not be reached",
                ));
                return;
            }
            Err(_) => {
                renewer.abort();
                let _ = self
                    .store
                    .release(&fence, Some("upstream timeout".into()))
                    .await;
                self.observe(&call, &record, "fresh", None, started);
                let _ = head_tx.send(problem(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_timeout",
                    "the MCP server did not answer within timeout",
                ));
                return;
            }
        };
        let status = resp.status();
        let (mut rparts, mut body) = resp.into_parts();
        rparts.headers = strip_response_hop_by_hop(&rparts.headers);
        let provider_request_id = header_str(&rparts.headers, "request-id")
            .or_else(|| header_str(&rparts.headers, "x-request-id"))
            .map(str::to_string);
        let is_sse = header_str(&rparts.headers, "content-type")
            .is_some_and(|c| c.to_ascii_lowercase().starts_with("text/event-stream"));
        let (tx, rx) = mpsc::channel::<Bytes>(1024);
        let mut head = Response::from_parts(rparts, ChannelBody { rx }.boxed());
        mark(head.headers_mut(), "fresh", &record);
        let mut client = (head_tx.send(head).is_ok()).then_some(tx);

        let limit = self.config.max_response;
        let mut parser = sse::Parser::new(limit);
        let mut buffered = Vec::new();
        let mut outcome = None;
        let mut failure = None;
        loop {
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => {
                    failure = Some("upstream timeout while streaming".to_string());
                    break;
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    failure = Some(format!("upstream stream broke: {e}"));
                    break;
                }
                Ok(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if let Some(tx) = &client {
                        // A client that left (or stopped reading) loses its stream; the
                        // call goes on.
                        if tx.try_send(data.clone()).is_err() {
                            client = None;
                        }
                    }
                    if is_sse {
                        for event in parser.feed(&data) {
                            if let Ok(v) = serde_json::from_str::<Value>(&event.data) {
                                if let Some(o) = jsonrpc::response_to(&v, &call.id) {
                                    outcome = Some(o);
                                }
                            }
                        }
                    } else if buffered.len() + data.len() <= limit {
                        buffered.extend_from_slice(&data);
                    } else {
                        failure = Some("tool result over max_response: not stored".to_string());
                    }
                }
            }
        }
        drop(client);
        if !is_sse && failure.is_none() {
            outcome = match serde_json::from_slice::<Value>(&buffered) {
                Ok(Value::Array(items)) => {
                    items.iter().find_map(|m| jsonrpc::response_to(m, &call.id))
                }
                Ok(v) => jsonrpc::response_to(&v, &call.id),
                Err(_) => None,
            };
        }
        renewer.abort();
        metrics::histogram!("oncely_upstream_seconds", "route" => call.route.clone())
            .record(upstream_started.elapsed().as_secs_f64());
        match (status.is_success(), outcome, failure) {
            (true, Some(Outcome::Result(result)), None) => {
                let completion = Completion {
                    response: StoredResponse {
                        status: 200,
                        headers: vec![("content-type".into(), "application/json".into())],
                        body: Some(serde_json::to_vec(&result).unwrap_or_default()),
                    },
                    units: call.units,
                    window: self.config.window,
                    replay_until: None,
                    provider_request_id,
                };
                if let Err(e) = self.store.complete(&fence, completion).await {
                    tracing::error!(record = %record.id, error = %e, "could not store a tool result");
                }
            }
            (_, outcome, failure) => {
                let why = failure.unwrap_or_else(|| match outcome {
                    Some(Outcome::Error(e)) => format!("JSON-RPC error (not stored): {e}"),
                    _ => format!("no tool result (HTTP {status})"),
                });
                if let Err(e) = self.store.release(&fence, Some(why)).await {
                    tracing::error!(record = %record.id, error = %e, "could not release a record");
                }
            }
        }
        self.observe(&call, &record, "fresh", Some(status.as_u16()), started);
    }

    async fn replay(
        &self,
        record: &Record,
        kind: ReplayKind,
        call: &Call,
        started: Instant,
    ) -> Response<McpBody> {
        let stored = record
            .response
            .as_ref()
            .and_then(|r| r.body.as_deref())
            .and_then(|b| serde_json::from_slice::<Value>(b).ok());
        let Some(mut result) = stored else {
            let text = format!(
                "The earlier call of `{}` with these arguments completed, but its result was too \
                 large to keep. It will not be run again within its window.",
                call.tool
            );
            return tool_error(
                &call.id,
                &text,
                json!({"status": "result_too_large"}),
                record,
            );
        };
        jsonrpc::set_meta(
            &mut result,
            REPLAY_META_KEY,
            json!({"status": kind.as_str(), "original_at": record.created_at.to_rfc3339(), "record": record.id.as_str()}),
        );
        if let Err(e) = self.store.add_repeats(&record.id, 1, call.units).await {
            tracing::warn!(record = %record.id, error = %e, "could not count a repeat");
        }
        self.observe(call, record, kind.as_str(), None, started);
        let mut resp = json_response(
            StatusCode::OK,
            &jsonrpc::result_message(&call.id, result),
            &[],
        );
        mark(resp.headers_mut(), kind.as_str(), record);
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
        resp
    }

    fn in_flight(&self, record: &Record, call: &Call, started: Instant) -> Response<McpBody> {
        let after = self.config.wait.as_secs().clamp(1, 30);
        let text = format!(
            "The original call of `{tool}` with these arguments is still running (it started at \
             {at}). It will not run twice. Call `{tool}` again with the same arguments after \
             {after} seconds to receive its result.",
            tool = call.tool,
            at = record.created_at.to_rfc3339(),
        );
        self.observe(call, record, "in_flight", None, started);
        let mut resp = tool_error(
            &call.id,
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
        status: &str,
        upstream_status: Option<u16>,
        started: Instant,
    ) {
        metrics::counter!("oncely_requests_total", "route" => call.route.clone(), "status" => status.to_string(), "tool" => call.tool.clone())
            .increment(1);
        tracing::info!(
            record = %record.id,
            route = %call.route,
            tool = %call.tool,
            principal = %call.principal,
            status,
            attempt = record.attempt,
            workflow_id = record.workflow_id.as_deref().unwrap_or(""),
            upstream_status = upstream_status.unwrap_or(0),
            duration_ms = started.elapsed().as_millis() as u64,
            "mcp tools/call"
        );
    }
}

/// For the stateless era: the routing headers of a tools/call must match its body.
fn header_mismatch(headers: &HeaderMap, message: &Value) -> Option<String> {
    let version = header_str(headers, "mcp-protocol-version")?;
    if HANDSHAKE_VERSIONS.contains(&version) {
        return None;
    }
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let name = message
        .pointer("/params/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if header_str(headers, "mcp-method") != Some(method) {
        return Some(format!(
            "Mcp-Method header does not match the body's method {method:?}"
        ));
    }
    if header_str(headers, "mcp-name") != Some(name) {
        return Some(format!(
            "Mcp-Name header does not match the body's tool name {name:?}"
        ));
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

fn workflow_id(headers: &HeaderMap) -> Option<String> {
    header_str(headers, "x-workflow-id")
        .map(str::to_string)
        .or_else(|| {
            header_str(headers, "traceparent")
                .and_then(|t| t.split('-').nth(1))
                .map(str::to_string)
        })
}

fn strip_hop_by_hop(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    for h in HOP_BY_HOP {
        out.remove(*h);
    }
    out
}

fn strip_response_hop_by_hop(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    for h in HOP_BY_HOP.iter().filter(|h| **h != "content-length") {
        out.remove(*h);
    }
    out
}

fn mark(headers: &mut HeaderMap, status: &str, record: &Record) {
    if let Ok(v) = HeaderValue::from_str(status) {
        headers.insert(HeaderName::from_static("oncely-status"), v);
    }
    if let Ok(v) = HeaderValue::from_str(record.id.as_str()) {
        headers.insert(HeaderName::from_static("oncely-record"), v);
    }
    if status == "fresh" {
        headers.remove(http::header::CONTENT_LENGTH);
    }
}

fn json_response(status: StatusCode, value: &Value, extra: &[(&str, &str)]) -> Response<McpBody> {
    let mut resp = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (k, v) in extra {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            resp.headers_mut().insert(k, v);
        }
    }
    resp
}

/// A tool result with `isError: true` and one text, marked with `_meta`.
fn tool_error(id: &Value, text: &str, meta: Value, record: &Record) -> Response<McpBody> {
    let mut result = json!({"content": [{"type": "text", "text": text}], "isError": true});
    jsonrpc::set_meta(&mut result, REPLAY_META_KEY, meta);
    let mut resp = json_response(StatusCode::OK, &jsonrpc::result_message(id, result), &[]);
    if let Ok(v) = HeaderValue::from_str(record.id.as_str()) {
        resp.headers_mut()
            .insert(HeaderName::from_static("oncely-record"), v);
    }
    resp
}

fn problem(status: StatusCode, code: &str, detail: &str) -> Response<McpBody> {
    let body = json!({"type": "about:blank", "title": status.canonical_reason().unwrap_or(""), "status": status.as_u16(), "code": code, "detail": detail});
    let mut resp = Response::new(full(serde_json::to_vec(&body).unwrap_or_default()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

fn empty(status: StatusCode) -> Response<McpBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = status;
    resp
}

#[allow(dead_code)]
fn now_rfc3339() -> String {
    Timestamp(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0),
    )
    .to_rfc3339()
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
            header_mismatch(&h, &msg),
            None,
            "no version header: handshake era"
        );
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-06-18"),
        );
        assert_eq!(header_mismatch(&h, &msg), None);
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2026-07-28"),
        );
        h.insert("mcp-method", HeaderValue::from_static("tools/call"));
        h.insert("mcp-name", HeaderValue::from_static("other"));
        assert!(header_mismatch(&h, &msg).unwrap().contains("Mcp-Name"));
        h.insert("mcp-name", HeaderValue::from_static("render"));
        assert_eq!(header_mismatch(&h, &msg), None);
        h.insert("mcp-method", HeaderValue::from_static("tools/list"));
        assert!(header_mismatch(&h, &msg).unwrap().contains("Mcp-Method"));
    }
}
