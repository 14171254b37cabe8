//! [`IdempotencyLayer`]: the guard and the route table, and nothing else.

use std::sync::Arc;

use tower::Layer;

use super::service::IdempotencyService;
use crate::guard::Guard;
use crate::policy::RoutePolicies;

/// Wraps a service so that guarded routes execute once per intention.
#[derive(Debug)]
pub struct IdempotencyLayer<P> {
    guard: Arc<Guard>,
    policies: Arc<P>,
}

impl<P> IdempotencyLayer<P> {
    /// A layer over `guard` that finds each request's policy in `policies`.
    pub fn new(guard: Arc<Guard>, policies: P) -> IdempotencyLayer<P> {
        IdempotencyLayer {
            guard,
            policies: Arc::new(policies),
        }
    }
}

impl<P> Clone for IdempotencyLayer<P> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            guard: self.guard.clone(),
            policies: self.policies.clone(),
        }
    }
}

impl<S, P: RoutePolicies> Layer<S> for IdempotencyLayer<P> {
    type Service = IdempotencyService<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.guard.clone(), self.policies.clone())
    }
}
