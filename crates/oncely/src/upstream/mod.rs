//! The reverse proxy: a tower `Service<Request<BoxBody>>` on hyper-util's pooled client.
//!
//! It sends a request to its route's [`Target`] (the route's policy, which the tower
//! layer matched once, is in the request's extensions and carries it), else to the
//! proxy's default target, rewrites the URI, drops hop-by-hop headers both ways (the one
//! policy, `oncely_http::headers`), adds `Forwarded` and `X-Forwarded-For`/`-Proto`/
//! `-Host`, retries temporary failures as the target says ([`retry`]), and
//! streams both bodies. An unguarded request takes one of the route's `concurrency`
//! slots and is timed by the route's `timeout` here; a guarded owner's request
//! ([`OwnerSend`]) holds its slot and is timed by its owner. The HTTP routes, the job
//! worker and every `[[mcp]]` endpoint send through a proxy.
//!
//! Client errors are [`UpstreamError`]s, as `oncely_tower::client` classifies them:
//! what the guard needs to tell "nothing happened" from "something may have".
//! `https://` upstreams are verified against the system's root certificates, plus the
//! PEM file named by the config's `upstream_ca` or the environment variable
//! `ONCELY_EXTRA_CA_FILE` (an extension, for private CAs and tests).

pub mod retry;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response, Version};
use oncely_tower::{BoxBody, BoxError, OwnerSend, RoutePolicy, UpstreamError};

use crate::config::Upstream;
use retry::RetryPolicy;

/// The environment variable naming extra CA certificates (PEM) for `https://` upstreams.
pub use oncely_http::client::EXTRA_CA_ENV;

pub use oncely_tower::client::UpstreamClient;

/// The gateway's upstream client: the system's roots, plus `extra_ca` (the config's
/// `upstream_ca`) and `$ONCELY_EXTRA_CA_FILE`.
pub fn upstream_client(extra_ca: Option<&std::path::Path>) -> anyhow::Result<UpstreamClient> {
    let options = oncely_http::client::ClientOptions::with_extra_ca(extra_ca);
    Ok(UpstreamClient::new(&options)?)
}

/// Where a request goes: an upstream, and how temporary failures are retried there.
#[derive(Debug, Clone)]
pub struct Target {
    /// The upstream.
    pub upstream: Upstream,
    /// The retries, if any.
    pub retry: Option<std::sync::Arc<RetryPolicy>>,
}

/// Who the client is, put on each request by the connection that received it (read by
/// the forwarding headers and the spans alike).
pub use oncely_tower::trace::Connection;

/// Removes hop-by-hop headers (the one policy, in `oncely_http::headers`).
pub use oncely_http::headers::strip_hop_by_hop;

/// Adds `X-Forwarded-For` (appended to any the client sent), `X-Forwarded-Proto`,
/// `X-Forwarded-Host` and `Forwarded` (RFC 7239, appended).
pub fn add_forwarding(headers: &mut HeaderMap, client: &Connection, host: Option<&HeaderValue>) {
    let ip = client.peer.ip();
    let proto = if client.https { "https" } else { "http" };
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prior) if !prior.trim().is_empty() => format!("{prior}, {ip}"),
        _ => ip.to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert("x-forwarded-for", v);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
    let for_ = if ip.is_ipv6() {
        format!("\"[{ip}]\"")
    } else {
        ip.to_string()
    };
    let mut fwd = format!("for={for_};proto={proto}");
    if let Some(h) = host.and_then(|h| h.to_str().ok()) {
        headers.insert(
            "x-forwarded-host",
            HeaderValue::from_str(h).expect("was a header value"),
        );
        if h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        {
            fwd.push_str(";host=");
            fwd.push_str(h);
        } else {
            fwd.push_str(&format!(";host=\"{}\"", h.replace('"', "")));
        }
    }
    let value = match headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        Some(prior) if !prior.trim().is_empty() => format!("{prior}, {fwd}"),
        _ => fwd,
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(header::FORWARDED, v);
    }
}

/// The URI of `original` on `upstream`: its scheme and authority, its path prefix, then
/// the original path and query.
pub fn upstream_uri(upstream: &Upstream, original: &Uri) -> Result<Uri, http::Error> {
    let pq = original.path_and_query().map_or("/", PathAndQuery::as_str);
    let pq = format!("{}{}", upstream.base_path(), pq);
    let mut parts = upstream.uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse()?);
    Ok(Uri::from_parts(parts)?)
}

/// The proxy service.
#[derive(Clone, Debug)]
pub struct Proxy {
    client: UpstreamClient,
    /// Where a request whose route attached no target goes.
    default: Option<Target>,
}

impl Proxy {
    /// A proxy sending each request to its route's target, else to `default`.
    pub fn new(client: UpstreamClient, default: Option<Target>) -> Proxy {
        Proxy { client, default }
    }
}

impl tower::Service<Request<BoxBody>> for Proxy {
    type Response = Response<BoxBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<BoxBody>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<BoxBody>) -> Self::Future {
        let client = self.client.clone();
        let route = req
            .extensions()
            .get::<std::sync::Arc<RoutePolicy>>()
            .cloned();
        let target = route
            .as_ref()
            .and_then(|p| p.attached.get::<Target>().cloned())
            .or_else(|| self.default.clone());
        // A guarded owner holds the route's slot and times its call; an unguarded
        // request on a route (a `read` route, a bypassed caller) is limited and timed
        // here: its wait for a slot and the answer's head within the route's `timeout`.
        let unguarded = route.filter(|_| req.extensions().get::<OwnerSend>().is_none());
        Box::pin(async move {
            let Some(Target { upstream, retry }) = target else {
                return Err(UpstreamError::BeforeSend(
                    "no upstream is configured for this path".into(),
                )
                .into());
            };
            let deadline = unguarded
                .as_ref()
                .map(|p| (tokio::time::Instant::now() + p.timeout, p.timeout));
            let slots = unguarded.and_then(|p| p.concurrency.as_ref().map(|c| c.slots.clone()));
            let (mut parts, body) = req.into_parts();
            let host = parts.headers.get(header::HOST).cloned().or_else(|| {
                parts
                    .uri
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            });
            // No hop-by-hop header, no Host (the client sets it from the upstream's
            // authority), then the forwarding headers.
            oncely_http::headers::forwardable_request(&mut parts.headers);
            if let Some(info) = parts.extensions.get::<Connection>().copied() {
                add_forwarding(&mut parts.headers, &info, host.as_ref());
            }
            parts.uri = upstream_uri(&upstream, &parts.uri)
                .map_err(|e| UpstreamError::BeforeSend(format!("bad upstream URI: {e}")))?;
            // The client span's url.full, server.address, server.port.
            if let Some(span) = parts
                .extensions
                .get::<oncely_tower::trace::UpstreamAttributes>()
            {
                span.target(&parts.uri);
            }
            parts.version = Version::HTTP_11;
            let permit = match slots {
                Some(sem) => {
                    let acquired = match deadline {
                        Some((at, t)) => {
                            match tokio::time::timeout_at(at, sem.acquire_owned()).await {
                                Ok(acquired) => acquired,
                                Err(_) => return Ok(busy(t)),
                            }
                        }
                        None => sem.acquire_owned().await,
                    };
                    Some(acquired.map_err(|_| {
                        UpstreamError::BeforeSend("the route's concurrency limit is closed".into())
                    })?)
                }
                None => None,
            };
            // `oncely_in_flight` and `oncely_upstream_seconds` are counted by the guard's
            // owner task (oncely-tower), which times the whole guarded exchange.
            let send = async {
                match retry {
                    Some(policy) => retry::send(&client, &policy, parts, body).await,
                    None => client.send(Request::from_parts(parts, body)).await,
                }
            };
            let res = match deadline {
                Some((at, t)) => match tokio::time::timeout_at(at, send).await {
                    Ok(res) => res?,
                    Err(_) => return Ok(timed_out(t)),
                },
                None => send.await?,
            };
            let (mut parts, body) = res.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            // The route's concurrency permit is held until the answer is read or dropped.
            let body = oncely_tower::body::holding(body, permit);
            Ok(Response::from_parts(parts, body))
        })
    }
}

/// 503 `upstream_busy` for an unguarded request that found no slot within `timeout`.
fn busy(timeout: std::time::Duration) -> Response<BoxBody> {
    tracing::info!(timeout = ?timeout, "no upstream slot within the route's timeout: not sent");
    oncely_tower::Problem::new(
        oncely_tower::ProblemCode::UpstreamBusy,
        format!(
            "every upstream slot of this route stayed taken for its timeout ({}s); the \
             request was not sent: send it again later",
            timeout.as_secs_f64()
        ),
    )
    .with_retry_after(1)
    .into_response()
}

/// 504 `upstream_timeout` for an unguarded request whose answer did not begin within
/// `timeout`.
fn timed_out(timeout: std::time::Duration) -> Response<BoxBody> {
    tracing::warn!(timeout = ?timeout, "the upstream did not answer within the route's timeout");
    oncely_tower::Problem::new(
        oncely_tower::ProblemCode::UpstreamTimeout,
        format!(
            "the upstream did not answer within the route's timeout ({}s)",
            timeout.as_secs_f64()
        ),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_headers_are_added_and_appended() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        let info = Connection {
            peer: "127.0.0.1:5555".parse().unwrap(),
            https: true,
        };
        add_forwarding(
            &mut h,
            &info,
            Some(&HeaderValue::from_static("api.example:8080")),
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "api.example:8080");
        assert_eq!(
            h["forwarded"],
            "for=127.0.0.1;proto=https;host=api.example:8080"
        );
        let mut h = HeaderMap::new();
        let v6 = Connection {
            peer: "[::1]:1".parse().unwrap(),
            https: false,
        };
        add_forwarding(&mut h, &v6, None);
        assert_eq!(h["forwarded"], "for=\"[::1]\";proto=http");
    }

    #[test]
    fn upstream_uris_keep_the_path_prefix_and_query() {
        let up = Upstream::parse("https://up.example:8443/api/").unwrap();
        let uri = upstream_uri(&up, &"/v1/render?x=1".parse().unwrap()).unwrap();
        assert_eq!(uri.to_string(), "https://up.example:8443/api/v1/render?x=1");
        let up = Upstream::parse("http://127.0.0.1:3000").unwrap();
        let uri = upstream_uri(&up, &"/a".parse().unwrap()).unwrap();
        assert_eq!(uri.to_string(), "http://127.0.0.1:3000/a");
    }
}
