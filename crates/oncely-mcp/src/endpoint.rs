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
//!   dropped, so the client's timeout never abandons the paid work upstream;
//! - a `tools/list` answer: passed through, and read on the way to learn which tools are
//!   read-only.
//!
//! What is stored is decided by a [`Classifier`] once the owner task has read the whole
//! answer: the JSON-RPC `result` for the call's id (found in a JSON body, a batch, or an
//! event stream) is stored; a JSON-RPC `error`, an HTTP error, or an answer without a
//! response releases the record, so the next identical call runs again. An answer over
//! `max_response` is stored without its body: repeats get an `isError` result saying the
//! result was too large to keep, and the tool does not run again within the window.
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
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oncely_core::{Class, FingerprintBuilder, Record, Scope, StoredResponse};
use oncely_tower::{
    Classified, Classifier, Execution, Guard, GuardedCall, UpstreamAnswer, UpstreamError,
    UpstreamFailure,
};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::body::{full, McpBody, Tap};
use crate::catalog::ToolCatalog;
use crate::config::{McpConfig, PrincipalSource};
use crate::jsonrpc::{self, Outcome, CONTINUATION_PARAMS, REPLAY_META_KEY};
use crate::sse;
use crate::{BoxError, McpError};

/// The pooled HTTP/HTTPS client the endpoint forwards with.
pub type UpstreamClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The environment variable naming extra CA certificates (PEM) for `https://` upstreams
/// (the gateway's proxy reads the same one).
pub const EXTRA_CA_ENV: &str = "ONCELY_EXTRA_CA_FILE";

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
    guard: Arc<Guard>,
    client: UpstreamClient,
    catalog: ToolCatalog,
    /// Guarded calls this endpoint is answering or running now, by (session, request id):
    /// their cancellations are dropped.
    guarded: Mutex<HashMap<(Option<String>, String), usize>>,
}

impl McpEndpoint {
    /// A pooled HTTP/1.1 client for `http://` and `https://` upstreams, trusting the
    /// system's root certificates, plus the PEM certificates in `extra_ca` and in the file
    /// `$ONCELY_EXTRA_CA_FILE` names.
    pub fn client(extra_ca: Option<&Path>) -> Result<UpstreamClient, McpError> {
        let mut roots = rustls::RootCertStore::empty();
        // A missing system store is not fatal: http upstreams and a CA file still work.
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        let env_ca = std::env::var_os(EXTRA_CA_ENV).map(std::path::PathBuf::from);
        for path in extra_ca.map(Path::to_path_buf).into_iter().chain(env_ca) {
            let pem = std::fs::read(&path)
                .map_err(|e| McpError::Config(format!("cannot read {}: {e}", path.display())))?;
            let certs = rustls_pemfile::certs(&mut pem.as_slice())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| McpError::Config(format!("{}: not PEM: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(McpError::Config(format!(
                    "{} holds no certificate",
                    path.display()
                )));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    McpError::Config(format!("{}: unusable CA certificate: {e}", path.display()))
                })?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| McpError::Config(format!("TLS setup: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector))
    }

    /// A client trusting the system's roots (and `$ONCELY_EXTRA_CA_FILE`).
    pub fn default_client() -> UpstreamClient {
        McpEndpoint::client(None).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "extra CA file ignored");
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            let connector = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(
                    rustls::ClientConfig::builder_with_provider(Arc::new(
                        rustls::crypto::ring::default_provider(),
                    ))
                    .with_safe_default_protocol_versions()
                    .expect("ring supports the default versions")
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
                )
                .https_or_http()
                .enable_http1()
                .wrap_connector(http);
            Client::builder(TokioExecutor::new()).build(connector)
        })
    }

    /// Builds the endpoint for `config`, guarding calls with `guard` (the gateway's one
    /// engine: its ledger, its principal hashing, its owner tasks), forwarding with
    /// `client`.
    pub fn new(config: McpConfig, guard: Arc<Guard>, client: UpstreamClient) -> McpEndpoint {
        McpEndpoint {
            inner: Arc::new(Inner {
                config,
                guard,
                client,
                catalog: ToolCatalog::new(),
                guarded: Mutex::new(HashMap::new()),
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
    guarded: GuardedCall,
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
                            if let Some(mismatch) = header_mismatch(&parts.headers, &message) {
                                return json_response(
                                    StatusCode::BAD_REQUEST,
                                    &jsonrpc::error_message(request.id, HEADER_MISMATCH, &mismatch),
                                );
                            }
                            if let Some(call) = self.read_call(&parts, &message) {
                                return self.clone().guard(&parts, bytes, call, &session).await;
                            }
                        }
                        "tools/list" => learn = true,
                        _ => {}
                    }
                }
            }
            Ok(Value::Array(items)) => return self.batch(parts, bytes, items, session).await,
            _ => {}
        }
        self.forward(parts, bytes, learn).await
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
        let mut calls = Vec::new();
        let mut dropped = false;
        for item in items {
            if jsonrpc::cancelled_request_id(&item)
                .is_some_and(|id| self.is_guarded_in_flight(&session, &id))
            {
                dropped = true;
                continue;
            }
            let guarded = jsonrpc::as_request(&item)
                .filter(|r| r.method == "tools/call")
                .and_then(|_| self.read_call(&parts, &item));
            match guarded {
                Some(call) => calls.push((item, call)),
                None => rest.push(item),
            }
        }
        let learn = rest
            .iter()
            .any(|m| jsonrpc::as_request(m).is_some_and(|r| r.method == "tools/list"));
        if calls.is_empty() {
            if rest.is_empty() {
                return empty(StatusCode::ACCEPTED);
            }
            let bytes = if dropped {
                Bytes::from(serde_json::to_vec(&rest).unwrap_or_default())
            } else {
                bytes
            };
            return self.forward(parts, bytes, learn).await;
        }
        let expects_answer = rest.iter().any(|m| jsonrpc::as_request(m).is_some());
        let forwarded = async {
            if rest.is_empty() {
                return Vec::new();
            }
            let bytes = Bytes::from(serde_json::to_vec(&rest).unwrap_or_default());
            let resp = self.clone().forward(parts.clone(), bytes, learn).await;
            let ids: Vec<Value> = rest
                .iter()
                .filter_map(|m| jsonrpc::as_request(m).map(|r| r.id.clone()))
                .collect();
            responses_of(resp, &ids).await
        };
        let guarded = futures::future::join_all(calls.into_iter().map(|(item, call)| {
            let me = self.clone();
            let parts = parts.clone();
            let session = session.clone();
            async move {
                let id = call.id.clone();
                let bytes = Bytes::from(serde_json::to_vec(&item).unwrap_or_default());
                let resp = me.guard(&parts, bytes, call, &session).await;
                responses_of(resp, std::slice::from_ref(&id)).await
            }
        }));
        let (mut answers, guarded) = tokio::join!(forwarded, guarded);
        answers.extend(guarded.into_iter().flatten());
        if answers.is_empty() && !expects_answer {
            return empty(StatusCode::ACCEPTED);
        }
        json_response(StatusCode::OK, &Value::Array(answers))
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

    /// The principal's keyed hash (the gateway's [`Guard::principal_hash`], so one account
    /// is one principal on HTTP routes and MCP endpoints alike), or `None` when the call is
    /// not to be guarded.
    fn principal(&self, headers: &HeaderMap) -> Option<String> {
        match &self.config.principal {
            PrincipalSource::None => Some(self.guard.single_tenant_principal()),
            // An empty header is a missing one: it names no account.
            PrincipalSource::Header(name) => headers
                .get(name)
                .filter(|v| !v.is_empty())
                .map(|v| self.guard.principal_hash(v.as_bytes())),
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
                    Ok(claim) => Some(self.guard.principal_hash(claim.as_bytes())),
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
        Some(Call {
            id: request.id.clone(),
            tool: tool.to_string(),
            guarded: GuardedCall {
                scope: Scope::new(&principal, &route),
                key: fingerprint.to_hex(),
                fingerprint,
                class: Class::Write,
                route,
                principal,
                window: self.config.window,
                wait: self.config.wait,
                lease: self.config.lease,
                timeout: self.config.timeout,
                max_response: self.config.max_response as u64,
                workflow_id: workflow_id(&parts.headers),
                units,
            },
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
        let _tracked = self.track(session, &call.id);
        let owner_tracked = self.track(session, &call.id);
        let req = self.upstream_request(parts, bytes);
        let client = self.client.clone();
        let id = call.id.clone();
        let run = move |_downstream| -> BoxFuture<'static, Result<UpstreamAnswer, UpstreamError>> {
            async move {
                let resp = client.request(req).await.map_err(|e| {
                    let text = error_chain(&e);
                    if e.is_connect() {
                        UpstreamError::BeforeSend(text)
                    } else {
                        UpstreamError::AfterSend(text)
                    }
                })?;
                let (parts, body) = resp.into_parts();
                let headers = strip_response_hop_by_hop(&parts.headers);
                let body = body.map_err(BoxError::from).boxed();
                Ok(UpstreamAnswer::new(parts.status, headers, body)
                    .with_classifier(classifier(id, owner_tracked)))
            }
            .boxed()
        };
        let execution = self.guard.execute(call.guarded.clone(), run).await;
        match execution {
            Execution::Fresh(fresh) => {
                self.observe(
                    &call,
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
            Execution::Replayed(record) => self.replay(&record, "replayed", &call, started),
            Execution::Joined(record) => self.replay(&record, "joined", &call, started),
            Execution::InFlight {
                record,
                retry_after,
            } => self.in_flight(&record, retry_after, &call, started),
            Execution::TooLarge(record) => {
                let text =
                    format!(
                    "The earlier call of `{tool}` with these arguments completed at {at}, but its \
                     result was larger than the gateway keeps, so it cannot be shown again. The \
                     tool ran once and will not run again for these arguments until its replay \
                     window ends ({until}). Do not retry it; tell the user the result was too \
                     large to return twice.",
                    tool = call.tool,
                    at = record.completed_at.unwrap_or(record.created_at).to_rfc3339(),
                    until = record.expires_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                );
                self.observe(&call, &record, "too_large", None, started);
                tool_error(
                    &call.id,
                    &text,
                    json!({"status": "result_too_large", "original_at": record.created_at.to_rfc3339()}),
                    &record,
                )
            }
            Execution::OutcomeUnknown(record) => {
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
            Execution::StoreUnavailable(why) => {
                tracing::error!(route = %call.guarded.route, error = %why,
                    "ledger unavailable: tools/call not forwarded");
                problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the ledger cannot be reached; the tool call was not forwarded",
                )
            }
            Execution::UpstreamFailed { record, failure } => {
                self.observe(&call, &record, "fresh", None, started);
                match failure {
                    UpstreamFailure::Unreachable(e) => {
                        tracing::warn!(route = %call.guarded.route, error = %e, "upstream unreachable");
                        problem(
                            StatusCode::BAD_GATEWAY,
                            "upstream_unreachable",
                            "the MCP server could not be reached",
                        )
                    }
                    UpstreamFailure::Lost(e) => {
                        tracing::warn!(route = %call.guarded.route, error = %e, "upstream failed");
                        problem(
                            StatusCode::BAD_GATEWAY,
                            "upstream_failed",
                            "the MCP server's answer broke off",
                        )
                    }
                    UpstreamFailure::Timeout => problem(
                        StatusCode::GATEWAY_TIMEOUT,
                        "upstream_timeout",
                        "the MCP server did not answer within timeout",
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

    fn replay(
        &self,
        record: &Record,
        kind: &str,
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
        jsonrpc::set_meta(
            &mut result,
            REPLAY_META_KEY,
            json!({"status": kind, "original_at": record.created_at.to_rfc3339(), "record": record.id.as_str()}),
        );
        self.observe(call, record, kind, None, started);
        let mut resp = json_response(StatusCode::OK, &jsonrpc::result_message(&call.id, result));
        mark(resp.headers_mut(), kind, record);
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
        resp
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
        // Labels are bounded: a tool no listing or config named counts as `other`.
        let tool = self.catalog.metric_label(&self.config.tools, &call.tool);
        metrics::counter!("oncely_requests_total", "route" => self.config.route_of(tool), "status" => status.to_string(), "tool" => tool.to_string())
            .increment(1);
        tracing::info!(
            record = %record.id,
            route = %call.guarded.route,
            tool = %call.tool,
            principal = %call.guarded.principal,
            status,
            attempt = record.attempt,
            workflow_id = record.workflow_id.as_deref().unwrap_or(""),
            upstream_status = upstream_status.unwrap_or(0),
            duration_ms = started.elapsed().as_millis() as u64,
            "mcp tools/call"
        );
    }
}

/// What the ledger keeps of a guarded call's answer, decided once the owner task has read
/// it whole: the `result` for `id` (stored as a JSON body), or nothing (released) for an
/// HTTP error, a JSON-RPC error, or no response at all. `tracked` keeps the call's
/// cancellations dropped until the owner task is done with it.
fn classifier(id: Value, tracked: Tracked) -> Classifier {
    Box::new(move |status, headers, body| {
        let _tracked = tracked;
        if !status.is_success() {
            return Classified::Release(format!("no tool result (HTTP {})", status.as_u16()));
        }
        let outcome = messages_in(headers, body)
            .iter()
            .find_map(|m| jsonrpc::response_to(m, &id));
        match outcome {
            Some(Outcome::Result(result)) => Classified::Store(StoredResponse {
                status: 200,
                headers: vec![("content-type".into(), "application/json".into())],
                body: Some(serde_json::to_vec(&result).unwrap_or_default()),
            }),
            Some(Outcome::Error(e)) => {
                Classified::Release(format!("JSON-RPC error (not stored): {e}"))
            }
            None => Classified::Release("no JSON-RPC response to the call in the answer".into()),
        }
    })
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

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
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

fn json_response(status: StatusCode, value: &Value) -> Response<McpBody> {
    let mut resp = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A tool result with `isError: true` and one text, marked with `_meta`.
fn tool_error(id: &Value, text: &str, meta: Value, record: &Record) -> Response<McpBody> {
    let mut result = json!({"content": [{"type": "text", "text": text}], "isError": true});
    jsonrpc::set_meta(&mut result, REPLAY_META_KEY, meta);
    let mut resp = json_response(StatusCode::OK, &jsonrpc::result_message(id, result));
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
