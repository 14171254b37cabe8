//! The owner's call to the inner service, as the HTTP layer and the job worker make it:
//! the answer boxed, its units, its span.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::FutureExt;
use http::{Request, Response};
use http_body::Body;
use tower::{Service, ServiceExt};

use crate::body::boxed;
use crate::guard::{UpstreamCall, UpstreamError, UpstreamResponse};
use crate::sources::MakeUnits;
use crate::trace::ClientSpan;
use crate::{BoxBody, BoxError};

/// Marks a request the guard's owner sends to the inner service. The owner holds the
/// route's upstream slot (its `concurrency`) and times the call (its `timeout`): the inner
/// service must do neither. A request without it was forwarded unguarded.
#[derive(Debug, Clone, Copy)]
pub struct OwnerSend;

/// The upstream call, its span (if any) ended with its answer.
pub(crate) fn traced(call: UpstreamCall, span: Option<ClientSpan>) -> UpstreamCall {
    let Some(span) = span else { return call };
    Box::pin(call.map(move |result| {
        match &result {
            Ok(answer) => span.answered(answer.status.as_u16()),
            Err(e) => span.failed(e.to_string()),
        }
        result
    }))
}

/// The owner's call: the inner service on the rebuilt request, its answer boxed, with
/// the units the route's rule reads from the answer.
pub(crate) fn call_upstream<S, ResBody>(
    inner: S,
    req: Request<BoxBody>,
    units: Arc<dyn MakeUnits>,
) -> UpstreamCall
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
            let units = units.response_units(&parts.headers);
            Ok(UpstreamResponse::new(parts.status, parts.headers, boxed(body)).with_units(units))
        }
        Err(e) => Err(upstream_error(e.into())),
    }))
}

/// An inner service's error: an [`UpstreamError`] it reported, or anything else, which
/// may hide an effect and so counts as lost after sending.
pub fn upstream_error(e: BoxError) -> UpstreamError {
    match e.downcast::<UpstreamError>() {
        Ok(u) => *u,
        Err(other) => UpstreamError::AfterSend(other.to_string()),
    }
}
