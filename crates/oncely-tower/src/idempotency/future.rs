//! [`ResponseFuture`]: the future of the layer's service (`IdempotencyService`).
//!
//! A pinned enum, as tower-http does it, for the cheap paths: a request on no guarded
//! route is the inner service's own future with its body boxed, nothing else. The
//! guarded path is a boxed future: it is a state machine of several store round trips,
//! an owner task and a wait, which an `async` block writes plainly and which costs one
//! allocation next to the store's own.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderValue, Response};
use http_body::Body;

use super::bypass::BypassLog;
use crate::body::boxed;
use crate::problem::{speak, Problem, ProblemCode, ONCELY_STATUS};
use crate::{BoxBody, BoxError};
use oncely_http::Dialect;

pin_project_lite::pin_project! {
    /// The response future of the layer's service (`IdempotencyService`).
    #[project = Proj]
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
        // The dialect the errors of the gateway's own are said in, on the way out.
        errors: Dialect,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        // Not guarded (or bypassed): the inner future, answer boxed, optionally marked.
        Forward {
            #[pin]
            fut: F,
            bypassed: Option<BypassLog>,
            // A route that forwards every time (`read`, `key = "none"`): `fresh`.
            fresh: bool,
            // The server span of an unguarded request and its upstream call's client span
            // (traces on), ended with its answer.
            span: Option<(crate::trace::Span, crate::trace::ClientSpan)>,
        },
        Guarded {
            fut: BoxFuture<'static, Response<BoxBody>>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn forward(fut: F, bypassed: Option<BypassLog>) -> Self {
        ResponseFuture {
            kind: Kind::Forward {
                fut,
                bypassed,
                fresh: false,
                span: None,
            },
            errors: Dialect::Problem,
        }
    }

    /// A request on a route that forwards every time (a `read` route, `key = "none"`):
    /// its answer is marked `Oncely-Status: fresh` (executed now), as every answer of a
    /// route is marked.
    pub(crate) fn executed(fut: F) -> Self {
        ResponseFuture {
            kind: Kind::Forward {
                fut,
                bypassed: None,
                fresh: true,
                span: None,
            },
            errors: Dialect::Problem,
        }
    }

    pub(crate) fn guarded(fut: BoxFuture<'static, Response<BoxBody>>) -> Self {
        ResponseFuture {
            kind: Kind::Guarded { fut },
            errors: Dialect::Problem,
        }
    }

    /// Ends `span` (an unguarded request's, with its upstream call's) with the answer.
    pub(crate) fn with_span(
        mut self,
        new: Option<(crate::trace::Span, crate::trace::ClientSpan)>,
    ) -> Self {
        if let Kind::Forward { span, .. } = &mut self.kind {
            *span = new;
        }
        self
    }

    /// Says the errors of the gateway's own in `errors` (the route's `errors`).
    pub(crate) fn in_dialect(mut self, errors: Dialect) -> Self {
        self.errors = errors;
        self
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    E: Into<BoxError>,
{
    type Output = Result<Response<BoxBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let errors = *this.errors;
        let res = match this.kind.project() {
            KindProj::Forward {
                fut,
                bypassed,
                fresh,
                span,
            } => {
                let result = ready!(fut.poll(cx));
                let (server, client) = span.take().unzip();
                let mut res = match result {
                    Ok(res) => {
                        if let Some(client) = client {
                            client.answered(res.status().as_u16());
                        }
                        res.map(boxed)
                    }
                    Err(e) => {
                        let e: BoxError = e.into();
                        if let Some(client) = client {
                            client.failed(e.to_string());
                        }
                        tracing::warn!(error = %e, "upstream failed on an unguarded request");
                        Problem::new(
                            ProblemCode::UpstreamUnreachable,
                            "the upstream could not be reached",
                        )
                        .into_response()
                    }
                };
                // An error of the gateway's own (the upstream unreachable, no slot, its
                // timeout) is its code, in `Oncely-Status` as on the span.
                let own = Problem::code_of(&res);
                if let Some(log) = bypassed.take() {
                    let status = own.unwrap_or("bypassed");
                    res.headers_mut()
                        .insert(ONCELY_STATUS, HeaderValue::from_static(status));
                    log.finish(res.status().as_u16(), own);
                } else if *fresh {
                    let status = own.unwrap_or("fresh");
                    res.headers_mut()
                        .insert(ONCELY_STATUS, HeaderValue::from_static(status));
                }
                if let Some(mut span) = server {
                    if *fresh {
                        span.fixed(crate::trace::attr::DECISION, own.unwrap_or("fresh"));
                    }
                    crate::trace::http_server_response(&mut span, res.status().as_u16(), own);
                    span.end();
                }
                res
            }
            KindProj::Guarded { fut } => ready!(fut.as_mut().poll(cx)),
        };
        Poll::Ready(Ok(speak(res, errors)))
    }
}
