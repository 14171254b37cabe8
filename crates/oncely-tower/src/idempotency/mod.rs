//! The idempotency middleware, the HTTP face of the guard: a tower [`Layer`](tower::Layer) for any hyper or axum
//! service.
//!
//! - [`layer`](IdempotencyLayer) holds only the guard and the route table;
//! - [`service`](IdempotencyService) decides per request: forward (no guarded route,
//!   `read`, `key = none`), bypass (`guard_when` did not match, or no principal), or guard;
//! - `handle` turns a guarded request into a [`GuardedCall`](crate::GuardedCall), runs
//!   [`Guard::execute`](crate::Guard::execute), and translates its
//!   [`Execution`](crate::Execution) into the answer;
//! - [`future`](ResponseFuture) is a pinned enum: the forwarded paths are the inner
//!   service's own future; the guarded path is boxed;
//! - `bypass` is the log line of a bypassed request, made by the service and written by
//!   the future.

mod bypass;
mod future;
pub(crate) mod handle;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use service::IdempotencyService;

#[cfg(test)]
mod tests;
