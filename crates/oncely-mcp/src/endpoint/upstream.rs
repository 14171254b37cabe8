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
        let bytes = message.bytes;
        let mut req = self.request(parts, bytes.clone());
        if message.owner {
            // The owner holds the endpoint's slot and times the call: the upstream does
            // neither.
            req.extensions_mut().insert(OwnerSend);
        }
        if message.own {
            route_own_request(req.headers_mut(), &bytes);
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

    fn body_replaced(head: &mut Self::Head) {
        head.headers.remove(http::header::CONTENT_LENGTH);
    }
}

/// Gives a request the owner of a call makes of its own (its server's task's `tasks/get`,
/// `tasks/result`), sent with the call's headers, the 2026-07-28 routing headers of its
/// own message: `Mcp-Method` its method, `Mcp-Name` its `taskId`, and no `Mcp-Param-*`
/// (they were the tool's). Headers without `Mcp-Method` (an earlier revision) are left.
fn route_own_request(headers: &mut http::HeaderMap, body: &[u8]) {
    let Some(said) = header_str(headers, "mcp-method").map(str::to_string) else {
        return;
    };
    let Ok(message) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    let Some(method) = message.get("method").and_then(serde_json::Value::as_str) else {
        return;
    };
    if method == said {
        return;
    }
    let Ok(value) = http::HeaderValue::from_str(method) else {
        return;
    };
    headers.insert("mcp-method", value);
    let params: Vec<_> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("mcp-param-"))
        .cloned()
        .collect();
    for name in params {
        headers.remove(name);
    }
    let task = message
        .pointer("/params/taskId")
        .and_then(serde_json::Value::as_str);
    match task.and_then(|t| http::HeaderValue::from_str(t).ok()) {
        Some(task) => {
            headers.insert("mcp-name", task);
        }
        None => {
            headers.remove("mcp-name");
        }
    }
}

/// `req` sent through `upstream`. A server that no longer knows the session `req` names
/// is answered as the transport says it must be, `404`, whatever form it said it in
/// ([`forgotten_session`]): a client (and the remote link of `oncely mcp --url`) starts a
/// new session on it. A boxed future: rustc cannot prove an `async` block holding the
/// service's `Send` for every lifetime of the boxed error type (rust-lang/rust#64552).
pub(crate) fn send(
    upstream: McpUpstream,
    req: Request<BoxBody>,
) -> BoxFuture<'static, Result<Response<BoxBody>, BoxError>> {
    use futures::{FutureExt, TryFutureExt};
    let in_session = req.headers().contains_key("mcp-session-id");
    let sent: BoxFuture<'static, Result<Response<BoxBody>, BoxError>> =
        Box::pin(upstream.oneshot(req));
    if !in_session {
        return sent;
    }
    Box::pin(sent.and_then(|resp| {
        if resp.status() == http::StatusCode::BAD_REQUEST {
            forgotten_session(resp).map(Ok).boxed()
        } else {
            futures::future::ready(Ok(resp)).boxed()
        }
    }))
}

/// Most bytes of a `400` read to learn whether it says the session is unknown.
const REFUSAL_LIMIT: usize = 64 << 10;

/// A `400` to a request in a session, as `404` when it says that the session is not one
/// the server knows. The Streamable HTTP transport answers a session the server ended
/// (or forgot, as a restarted server does) with `404`, but servers built on the
/// TypeScript SDK's examples, the reference server among them, answer `400` "Bad Request:
/// No valid session ID provided". Any other `400` passes as it came.
async fn forgotten_session(resp: Response<BoxBody>) -> Response<BoxBody> {
    let (mut head, body) = resp.into_parts();
    let bytes = match read_refusal(body).await {
        Ok(bytes) => bytes,
        // Too large (or broken) to be a refusal of the session: a 400 all the same.
        Err(_) => {
            head.headers.remove(http::header::CONTENT_LENGTH);
            return Response::from_parts(head, full(Bytes::new()));
        }
    };
    if says_session_unknown(&bytes) {
        tracing::info!("the MCP server no longer knows the session (it answered 400): 404");
        head.status = http::StatusCode::NOT_FOUND;
    }
    Response::from_parts(head, full(bytes))
}

/// A refusal's body, up to [`REFUSAL_LIMIT`] (its error as text: a boxed future whose
/// output holds no boxed error, for the `Send` proof of the `async fn` that awaits it).
fn read_refusal(body: BoxBody) -> BoxFuture<'static, Result<Bytes, String>> {
    use futures::TryFutureExt;
    use http_body_util::BodyExt;
    Box::pin(
        http_body_util::Limited::new(body, REFUSAL_LIMIT)
            .collect()
            .map_ok(|c| c.to_bytes())
            .map_err(|e| e.to_string()),
    )
}

/// Whether a refusal's body says the request's session is not one the server knows: a
/// JSON-RPC error (or text) that names the session id as missing, invalid, unknown or
/// expired.
fn says_session_unknown(body: &[u8]) -> bool {
    let text = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => v
            .pointer("/error/message")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_ascii_lowercase(),
        Err(_) => String::from_utf8_lossy(body).to_ascii_lowercase(),
    };
    let text = text.replace(['-', '_'], " ");
    let names_id = text.contains("session id") || text.contains("sessionid");
    let refused = [
        "no valid",
        "invalid",
        "unknown",
        "not found",
        "expired",
        "missing",
    ];
    (names_id && refused.iter().any(|w| text.contains(w)))
        || ["session not found", "unknown session", "session expired"]
            .iter()
            .any(|w| text.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_servers_answer_a_forgotten_session_in_are_recognised() {
        for body in [
            &br#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":1}"#[..],
            br#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"},"id":null}"#,
            br#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Invalid or expired session ID"}}"#,
            b"Bad Request: invalid session id",
        ] {
            assert!(says_session_unknown(body), "{}", String::from_utf8_lossy(body));
        }
        for body in [
            &br#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid Request"},"id":1}"#[..],
            br#"{"jsonrpc":"2.0","error":{"code":-32602,"message":"invalid params: session_name"},"id":1}"#,
            b"",
        ] {
            assert!(!says_session_unknown(body), "{}", String::from_utf8_lossy(body));
        }
    }
}
