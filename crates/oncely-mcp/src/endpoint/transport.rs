//! The HTTP transport of an endpoint: reads one request (its body under the limit, its
//! session, its protocol era, its caller), checks what only HTTP carries (the stateless
//! era's routing headers match the body), holds back a session's end while calls this
//! endpoint owns run on it, passes what is not a message (`GET` streams) straight
//! through, and hands every message to the core; the core's reply becomes the answer
//! (`response`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use oncely_tower::trace::{Span, SpanKind, SpanParent};
use oncely_tower::{Guard, RequestFacts, RequestHead};
use serde_json::Value;
use tokio::time::Instant;

use super::headers::{header_mismatch, header_str, is_modern, param_mismatch, NAME, TASK_ID};
use super::response::{empty, json_response, problem, render};
use super::upstream::HttpServer;
use crate::config::McpConfig;
use crate::core::{Caller, Context, Core};
use crate::jsonrpc;
use crate::jsonrpc::code;
use crate::BoxBody;
use crate::BoxError;
use oncely_http::problem::ProblemCode;

/// The core of an HTTP endpoint.
pub(super) type HttpCore = Core<HttpServer>;

/// The caller of an HTTP request: its head, where its principal and workflow id are
/// read, and the request's HTTP server span, under which each message is a span.
struct HttpCaller(Arc<http::request::Parts>, Option<SpanParent>);

impl Caller for HttpCaller {
    fn facts(&self, guard: &Guard, config: &McpConfig) -> RequestFacts {
        let head = RequestHead::of_parts(&self.0);
        RequestFacts::unspanned(guard, &head, &*config.principal)
    }

    fn span(&self, _guard: &Guard) -> Option<Span> {
        self.1
            .as_ref()
            .map(|http| http.child(String::new(), SpanKind::Server))
    }

    fn revision(&self) -> Option<&str> {
        header_str(&self.0.headers, "mcp-protocol-version")
    }
}

/// Answers one request. It is an HTTP server span (traces on: `{method} {path}`, the
/// HTTP conventions, ended with the answer's head), and each message it carries an MCP
/// server span under it, as the MCP conventions draw Streamable HTTP.
pub(super) async fn handle<B>(core: Arc<HttpCore>, req: Request<B>) -> Response<BoxBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let span = core.guard.tracer().map(|t| {
        let mut span = t.start_request(req.headers(), String::new());
        oncely_tower::trace::http_server_request(&mut span, &req, Some(&core.config().path));
        span
    });
    let resp = answer(core, req, span.as_ref().map(Span::as_parent)).await;
    if let Some(mut span) = span {
        let own = oncely_http::problem::Problem::code_of(&resp);
        oncely_tower::trace::http_server_response(&mut span, resp.status().as_u16(), own);
        span.end();
    }
    resp
}

/// [`handle`] under the request's span `span`.
async fn answer<B>(
    core: Arc<HttpCore>,
    req: Request<B>,
    span: Option<SpanParent>,
) -> Response<BoxBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let bytes =
        match oncely_tower::read_body(body, &parts.headers, core.config().max_body as u64).await {
            Ok(bytes) => bytes,
            Err(p) => return p.into_response(),
        };
    let session = header_str(&parts.headers, "mcp-session-id").map(str::to_string);
    if parts.method == Method::DELETE {
        if let Some(session) = session.clone().filter(|s| core.owns_calls_on(s)) {
            return end_session_later(core, parts, bytes, session);
        }
    }
    if parts.method != Method::POST {
        return pass_through(&core, &parts, bytes, span.as_ref()).await;
    }
    if let Some(refusal) = routing_mismatch(&core, &parts, &bytes) {
        return json_response(StatusCode::BAD_REQUEST, &refusal);
    }
    let parts = Arc::new(parts);
    let context = Context {
        session,
        modern: is_modern(&parts.headers),
        caller: Arc::new(HttpCaller(parts.clone(), span)),
        origin: parts,
    };
    render(core.handle(bytes, context).await)
}

/// The stateless era's check of a request's headers against its message: a `tools/call`
/// (its `Mcp-Name` the tool, and the `Mcp-Param-*` headers of the parameters the tool's
/// listed schema marks) and a `tasks/*` request (its `Mcp-Name` the task) whose headers
/// do not match are refused with -32020 (HTTP 400), before the core sees them. A
/// cancellation the core takes, and a `tools/call` the core refuses as unreadable, are
/// left to it.
fn routing_mismatch(core: &HttpCore, parts: &http::request::Parts, bytes: &[u8]) -> Option<Value> {
    let message = jsonrpc::parse(bytes).filter(Value::is_object)?;
    let request = jsonrpc::as_request(&message)?;
    let text = std::str::from_utf8(bytes).unwrap_or_default();
    let name = match request.method {
        "tools/call" if crate::core::unreadable_call(&message, text).is_none() => NAME,
        method if method.starts_with("tasks/") && is_modern(&parts.headers) => TASK_ID,
        _ => return None,
    };
    let params = || {
        let tool = message.pointer("/params/name").and_then(Value::as_str)?;
        let params = core.catalog().header_params(tool)?;
        param_mismatch(&parts.headers, &message, &params)
    };
    let mismatch = header_mismatch(&parts.headers, &message, name).or_else(|| {
        (name == NAME && is_modern(&parts.headers))
            .then(params)
            .flatten()
    })?;
    Some(jsonrpc::error_message(
        request.id,
        code::HEADER_MISMATCH,
        &mismatch,
    ))
}

/// A request that carries no message (a `GET` stream, a `DELETE`): sent on as it came,
/// its answer streamed back; under `span`, its upstream call a client span.
async fn pass_through(
    core: &HttpCore,
    parts: &http::request::Parts,
    bytes: Bytes,
    span: Option<&SpanParent>,
) -> Response<BoxBody> {
    let server = core.server();
    let mut req = server.request(parts, bytes);
    let client = span.map(|p| {
        let client = p.upstream_call(req.headers_mut(), &parts.method);
        let attributes = client.attributes();
        attributes.target(req.uri());
        req.extensions_mut().insert(attributes);
        client
    });
    match server.call(req).await {
        Ok(resp) => {
            if let Some(client) = client {
                client.answered(resp.status().as_u16());
            }
            resp
        }
        Err(e) => {
            if let Some(client) = client {
                client.failed(e.to_string());
            }
            tracing::warn!(route = %core.config().path, error = %e, "upstream unreachable");
            problem(
                ProblemCode::UpstreamUnreachable,
                "the MCP server could not be reached",
            )
        }
    }
}

/// A client ends its session (`DELETE`) while upstream calls this endpoint owns run on
/// it: the upstream would abort them (and a retry would pay again). The client's
/// session ends now (answered 200); the upstream session ends once those calls are
/// done and recorded (or after `timeout`, when they cannot still be running).
fn end_session_later(
    core: Arc<HttpCore>,
    parts: http::request::Parts,
    bytes: Bytes,
    session: String,
) -> Response<BoxBody> {
    tracing::info!(route = %core.config().path, session = %session,
        "session end held back until its guarded tools/call calls are done");
    tokio::spawn(async move {
        let deadline = Instant::now() + core.config().timeout + Duration::from_secs(5);
        core.owned_calls_done(&session, deadline).await;
        let resp = pass_through(&core, &parts, bytes, None).await;
        tracing::info!(route = %core.config().path, session = %session,
            status = resp.status().as_u16(), "held session end forwarded");
    });
    empty(StatusCode::OK)
}
