//! What every part of an endpoint shares: its state ([`Inner`]: the config, the engine, the
//! upstream, the tool catalog, the sessions' calls) and its one way upstream, the
//! [`McpUpstream`] service and the request it is sent.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use oncely_tower::{BoxBody, Guard};
use tower::ServiceExt;

use super::sessions::Sessions;
use crate::body::full;
use crate::catalog::ToolCatalog;
use crate::config::McpConfig;
use crate::BoxError;

/// Where an endpoint sends everything it forwards, guarded or not: a tower service from a
/// request (its URI the MCP server's, its headers as the client sent them) to the
/// server's answer. The gateway gives each endpoint a proxy of its own (the entry's
/// `retries`, `Forwarded` and `X-Forwarded-*`); `McpEndpoint::direct` is the plain one.
/// An error that is an [`UpstreamError`](oncely_tower::UpstreamError) tells "nothing was
/// sent" from "it may have been"; any other error counts as "it may have been".
pub type McpUpstream =
    tower::util::BoxCloneSyncService<Request<BoxBody>, Response<BoxBody>, BoxError>;

/// One endpoint's state, shared by its transport and its guard.
pub(super) struct Inner {
    pub(super) config: McpConfig,
    pub(super) guard: Arc<Guard>,
    pub(super) upstream: McpUpstream,
    pub(super) catalog: ToolCatalog,
    /// The guarded calls in flight and the upstream calls owned, by client session.
    pub(super) sessions: Arc<Sessions>,
}

impl Inner {
    /// The state of a new endpoint for `config`.
    pub(super) fn new(config: McpConfig, guard: Arc<Guard>, upstream: McpUpstream) -> Inner {
        Inner {
            config,
            guard,
            upstream,
            catalog: ToolCatalog::new(),
            sessions: Arc::new(Sessions::new()),
        }
    }

    /// The upstream request for `parts` with `body`: the server's URI with the client's
    /// query, the client's headers (the upstream service drops what crosses one hop) and
    /// extensions (who the client is, for `Forwarded`), and the length of `body`, which
    /// is sent whole.
    pub(super) fn upstream_request(
        &self,
        parts: &http::request::Parts,
        body: Bytes,
    ) -> Request<BoxBody> {
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
}

/// `req` sent through `upstream`. A boxed future, not an `async` block holding the
/// service's: rustc cannot prove that one `Send` for every lifetime of the boxed error
/// type (rust-lang/rust#64552).
pub(super) fn send(
    upstream: McpUpstream,
    req: Request<BoxBody>,
) -> BoxFuture<'static, Result<Response<BoxBody>, BoxError>> {
    Box::pin(upstream.oneshot(req))
}
