//! The endpoint's way upstream: the [`McpUpstream`] service, and the core's [`Server`] on
//! it ([`HttpServer`]): a message is sent as the client's request was (its headers, query
//! and extensions) with the message as its body, and the answer read as HTTP (its status,
//! its framing, what its headers tell the ledger).

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use oncely_tower::{AnswerFacts, BoxBody, OwnerSend, UpstreamError};
use tower::ServiceExt;

use super::headers::header_str;
use crate::body::full;
use crate::core::{Framing, Outgoing, Refusal, Server, ServerAnswer};
use crate::BoxError;

/// Where an endpoint sends everything it forwards, guarded or not: a tower service from a
/// request (its URI the MCP server's, its headers as the client sent them) to the
/// server's answer. The gateway gives each endpoint a proxy of its own (the entry's
/// `retries`, `Forwarded` and `X-Forwarded-*`); `McpEndpoint::direct` is the plain one.
/// An error that is an [`UpstreamError`](oncely_tower::UpstreamError) tells "nothing was
/// sent" from "it may have been"; any other error counts as "it may have been".
pub type McpUpstream =
    tower::util::BoxCloneSyncService<Request<BoxBody>, Response<BoxBody>, BoxError>;

/// The MCP server over HTTP, as the core reaches it.
pub(crate) struct HttpServer {
    /// The server's URL.
    pub(crate) url: Uri,
    pub(crate) upstream: McpUpstream,
}

impl HttpServer {
    /// The upstream request for `parts` with `body`: the server's URI with the client's
    /// query, the client's headers (the upstream service drops what crosses one hop) and
    /// extensions (who the client is, for `Forwarded`), and the length of `body`, which
    /// is sent whole.
    pub(crate) fn request(&self, parts: &http::request::Parts, body: Bytes) -> Request<BoxBody> {
        let base = &self.url;
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

    /// `req` sent upstream.
    pub(crate) fn call(
        &self,
        req: Request<BoxBody>,
    ) -> BoxFuture<'static, Result<Response<BoxBody>, BoxError>> {
        send(self.upstream.clone(), req)
    }
}

impl Server for HttpServer {
    type Origin = Arc<http::request::Parts>;
    type Head = http::response::Parts;

    fn send(
        &self,
        message: Outgoing<'_, Self::Origin>,
    ) -> BoxFuture<'static, Result<ServerAnswer<Self::Head>, UpstreamError>> {
        let parts = message.origin;
        let mut req = self.request(parts, message.bytes);
        if message.owner {
            // The owner holds the endpoint's slot and times the call: the upstream does
            // neither.
            req.extensions_mut().insert(OwnerSend);
        }
        let span = message.span.map(|p| {
            let span = p.upstream_call(req.headers_mut(), &parts.method);
            // The sender fills in the upstream's URL and the resends (a route's retries).
            let attributes = span.attributes();
            attributes.target(req.uri());
            req.extensions_mut().insert(attributes);
            span
        });
        let sent = self.call(req);
        Box::pin(async move {
            let resp = match sent.await {
                Ok(resp) => resp,
                Err(e) => {
                    let e = oncely_tower::upstream_error(e);
                    if let Some(span) = span {
                        span.failed(e.to_string());
                    }
                    return Err(e);
                }
            };
            if let Some(span) = span {
                span.answered(resp.status().as_u16());
            }
            let (head, body) = resp.into_parts();
            let status = head.status;
            let is_sse = header_str(&head.headers, "content-type")
                .is_some_and(|c| c.to_ascii_lowercase().starts_with("text/event-stream"));
            let refused = (!status.is_success()).then(|| Refusal {
                reason: format!("HTTP {}", status.as_u16()),
                not_served: matches!(status.as_u16(), 404 | 405 | 501),
                status: status.as_u16(),
            });
            Ok(ServerAnswer {
                framing: if is_sse {
                    Framing::EventStream
                } else {
                    Framing::Json
                },
                ledger: AnswerFacts::read(&head.headers),
                body: oncely_tower::body::stream(body),
                refused,
                head,
            })
        })
    }
}

/// `req` sent through `upstream`. A boxed future, not an `async` block holding the
/// service's: rustc cannot prove that one `Send` for every lifetime of the boxed error
/// type (rust-lang/rust#64552).
pub(crate) fn send(
    upstream: McpUpstream,
    req: Request<BoxBody>,
) -> BoxFuture<'static, Result<Response<BoxBody>, BoxError>> {
    Box::pin(upstream.oneshot(req))
}
