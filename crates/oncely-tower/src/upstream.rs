//! The owner's call to the inner service, as the HTTP layer and the job worker make it:
//! the answer boxed, its units, its span; and a request's units by the route's rule.

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use http::{HeaderMap, HeaderName, Request, Response};
use http_body::Body;
use tower::{Service, ServiceExt};

use crate::body::boxed;
use crate::guard::{UpstreamAnswer, UpstreamError};
use crate::policy::UnitsRule;
use crate::trace::ClientSpan;
use crate::{BoxBody, BoxError};

/// The upstream call, its span (if any) ended with its answer.
pub(crate) fn traced(
    call: BoxFuture<'static, Result<UpstreamAnswer, UpstreamError>>,
    span: Option<ClientSpan>,
) -> BoxFuture<'static, Result<UpstreamAnswer, UpstreamError>> {
    let Some(span) = span else { return call };
    Box::pin(call.map(move |result| {
        match &result {
            Ok(answer) => span.answered(answer.status.as_u16()),
            Err(e) => span.failed(e.to_string()),
        }
        result
    }))
}

/// The owner's call: the inner service on the rebuilt request, its answer boxed.
pub(crate) fn call_upstream<S, ResBody>(
    inner: S,
    req: Request<BoxBody>,
    units_header: Option<HeaderName>,
) -> BoxFuture<'static, Result<UpstreamAnswer, UpstreamError>>
where
    S: Service<Request<BoxBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    // A combinator, not an `async` block: rustc cannot prove an `async` block holding
    // `S::Future` Send for every lifetime of the boxed error type (rust-lang/rust#64552).
    Box::pin(inner.oneshot(req).map(move |result| match result {
        Ok(res) => {
            let (parts, body) = res.into_parts();
            let units = units_header.map(|name| header_units(&parts.headers, &name));
            Ok(UpstreamAnswer::new(parts.status, parts.headers, boxed(body)).with_units(units))
        }
        Err(e) => Err(upstream_error(e.into())),
    }))
}

/// Units of the request, by the route's rule (`response_header` is read from the answer).
pub(crate) fn request_units(rule: &UnitsRule, body: &[u8]) -> u64 {
    match rule {
        UnitsRule::None | UnitsRule::ResponseHeader(_) => 0,
        UnitsRule::BodyBytes => body.len() as u64,
        UnitsRule::Json(pointer) => {
            let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
                return 0;
            };
            match value.pointer(pointer) {
                Some(serde_json::Value::String(s)) => s.chars().count() as u64,
                Some(serde_json::Value::Number(n)) => n
                    .as_u64()
                    .or_else(|| n.as_f64().filter(|f| *f > 0.0).map(|f| f as u64))
                    .unwrap_or(0),
                _ => 0,
            }
        }
    }
}

fn header_units(headers: &HeaderMap, name: &HeaderName) -> u64 {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// An inner service's error: an [`UpstreamError`] it reported, or anything else, which
/// may hide an effect and so counts as lost after sending.
fn upstream_error(e: BoxError) -> UpstreamError {
    match e.downcast::<UpstreamError>() {
        Ok(u) => *u,
        Err(other) => UpstreamError::AfterSend(other.to_string()),
    }
}
