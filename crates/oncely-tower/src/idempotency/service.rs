//! [`IdempotencyService`]: decides per request whether to forward, bypass or guard.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower::util::Oneshot;
use tower::{Service, ServiceExt};

use super::bypass::BypassLog;
use super::future::ResponseFuture;
use crate::body::boxed;
use crate::facts::RequestFacts;
use crate::guard::Guard;
use crate::policy::RoutePolicies;
use crate::sources::RequestHead;
use crate::{BoxBody, BoxError};

/// The service the layer (`IdempotencyLayer`) makes. Every failure is an
/// HTTP answer, so its error is `Infallible`.
#[derive(Debug)]
pub struct IdempotencyService<S, P> {
    inner: S,
    guard: Arc<Guard>,
    policies: Arc<P>,
}

impl<S, P> IdempotencyService<S, P> {
    pub(crate) fn new(inner: S, guard: Arc<Guard>, policies: Arc<P>) -> Self {
        IdempotencyService {
            inner,
            guard,
            policies,
        }
    }
}

impl<S: Clone, P> Clone for IdempotencyService<S, P> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            guard: self.guard.clone(),
            policies: self.policies.clone(),
        }
    }
}

impl<S, P, B, ResBody> Service<Request<B>> for IdempotencyService<S, P>
where
    S: Service<Request<BoxBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    P: RoutePolicies,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<BoxBody>;
    type Error = std::convert::Infallible;
    type Future = ResponseFuture<Oneshot<S, Request<BoxBody>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is asked of the clone that serves each request (`oneshot`), so that
        // an owner task can run on a service of its own, off the caller's connection.
        let _ = cx;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let started = Instant::now();
        if req.uri().path().starts_with(crate::jobs::JOBS_PATH) {
            let guard = self.guard.clone();
            let head = Request::from_parts(req.into_parts().0, ());
            return ResponseFuture::guarded(Box::pin(async move {
                crate::jobs::status_endpoint(&guard, &head).await
            }));
        }
        let Some(policy) = self.policies.policy(req.method(), req.uri().path()) else {
            let mut req = req;
            let span = unguarded_span(&self.guard, &mut req, None);
            return ResponseFuture::forward(self.inner.clone().oneshot(req.map(boxed)), None)
                .with_span(span)
                .in_dialect(self.policies.default_errors());
        };
        let errors = policy.errors;
        let mut req = req;
        // The route is matched once: the inner service finds it here.
        req.extensions_mut().insert(policy.clone());
        if !policy.deduplicates() {
            let span = unguarded_span(&self.guard, &mut req, Some(&policy));
            return ResponseFuture::executed(self.inner.clone().oneshot(req.map(boxed)))
                .with_span(span)
                .in_dialect(errors);
        }
        let mut facts = RequestFacts::read(&self.guard, &RequestHead::of(&req), &*policy.principal);
        if let Some(span) = &mut facts.span {
            crate::trace::http_server_request(
                span,
                &req,
                Some(crate::trace::route_path(&policy.name)),
            );
            span.fixed(crate::trace::attr::CLASS, policy.class.as_str());
        }
        match super::handle::Decision::of(&policy, &facts, &req) {
            super::handle::Decision::Bypass { principal } => {
                let RequestFacts {
                    workflow_id, span, ..
                } = facts;
                if let Some(span) = &span {
                    span.propagate(req.headers_mut());
                }
                let log = BypassLog {
                    route: policy.name.clone(),
                    principal,
                    workflow_id,
                    started,
                    span,
                };
                ResponseFuture::forward(self.inner.clone().oneshot(req.map(boxed)), Some(log))
                    .in_dialect(errors)
            }
            super::handle::Decision::Guard { principal } => {
                let fut = super::handle::guarded(
                    self.guard.clone(),
                    policy,
                    principal,
                    facts,
                    req,
                    self.inner.clone(),
                    started,
                );
                ResponseFuture::guarded(Box::pin(fut)).in_dialect(errors)
            }
        }
    }
}

/// The spans of a request the guard forwards without a record (no route, or a route
/// that forwards every time), traces on: its server span (the HTTP conventions), and the
/// client span of its upstream call under it, whose `traceparent` the upstream gets.
fn unguarded_span<B>(
    guard: &crate::guard::Guard,
    req: &mut Request<B>,
    policy: Option<&crate::policy::RoutePolicy>,
) -> Option<(crate::trace::Span, crate::trace::ClientSpan)> {
    let tracer = guard.tracer()?;
    let mut span = tracer.start_request(req.headers(), String::new());
    crate::trace::http_server_request(
        &mut span,
        req,
        policy.map(|p| crate::trace::route_path(&p.name)),
    );
    if let Some(p) = policy {
        span.fixed(crate::trace::attr::CLASS, p.class.as_str());
    }
    let method = req.method().clone();
    let client = span.as_parent().upstream_call(req.headers_mut(), &method);
    // The sender fills in the upstream's URL and the resends.
    let more = client.attributes();
    more.target(req.uri());
    req.extensions_mut().insert(more);
    Some((span, client))
}
