//! A tower layer that makes any HTTP service safe to call twice.
//!
//! Wrap a service in [`IdempotencyLayer`] and every distinct intention on a guarded route
//! executes once: a repeat gets the first answer back (`Oncely-Status: replayed`), a
//! repeat that arrives while the first still runs waits for it (`joined`), and when
//! nobody can know whether an action happened the answer says so (409
//! `outcome_unknown`) instead of guessing. The upstream call is owned by the guard, not
//! by the client's connection: a client that goes away cancels nothing, and the result
//! is recorded anyway.
//!
//! ```
//! use std::sync::Arc;
//! use http::{Method, Request, Response};
//! use oncely_core::Class;
//! use oncely_store::{memory::MemoryStore, SystemClock};
//! use oncely_tower::{body, BoxBody, Guard, IdempotencyLayer, PrincipalSource, RoutePolicy};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
//! let guard = Arc::new(Guard::new(store, b"principal hashing key".to_vec()));
//! let mut render = RoutePolicy::new("POST /v1/render", Class::Write);
//! render.principal = PrincipalSource::None; // one tenant
//! let render = Arc::new(render);
//! let routes = move |m: &Method, p: &str| (m == Method::POST && p == "/v1/render").then(|| render.clone());
//!
//! let upstream = service_fn(|_req: Request<BoxBody>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(body::full("rendered")))
//! });
//! let svc = IdempotencyLayer::new(guard.clone(), routes).layer(upstream);
//!
//! let req = || Request::post("/v1/render").header("idempotency-key", "k1").body(body::full("hi")).unwrap();
//! let first = svc.clone().oneshot(req()).await.unwrap();
//! assert_eq!(first.headers()["oncely-status"], "fresh");
//! # drop(first.into_body()); guard.drain().await;
//! let again = svc.clone().oneshot(req()).await.unwrap();
//! assert_eq!(again.headers()["oncely-status"], "replayed");
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! # }
//! ```
//!
//! # Layout
//!
//! - [`policy`]: what a guarded route is ([`RoutePolicy`]) and how one is found per
//!   request ([`RoutePolicies`]).
//! - [`guard`]: the engine, protocol-agnostic: [`Guard::execute`] claims, runs the
//!   owner's call on its own task, waits, replays, refuses; it answers an [`Execution`].
//! - [`idempotency`]: the tower layer, a thin translation of requests into
//!   [`GuardedCall`]s and of [`Execution`]s into responses.
//! - [`jobs`]: `job` routes: the durable queue's side of the guard ([`Guard::submit_job`]),
//!   the [`JobWorker`] that runs queued jobs, and `/_oncely/jobs/ID`.
//! - [`seal`]: what a queued job keeps is encrypted with a [`JobKey`] before the store
//!   sees it.
//! - [`headers`], [`problem`]: re-exported from `oncely-http` (the one header policy;
//!   the gateway's own errors, `application/problem+json`).
//! - [`trace`]: W3C trace context in and out, and the spans of guarded requests, handed
//!   to a [`SpanSink`](trace::SpanSink) (the binary's exports them over OTLP).
//! - [`body`]: boxing bodies, and the channel an owner streams its answer through.
//! - `owner` (private): the owner task; `budget` (private): what answers in flight may
//!   hold; [`wait_for_slot`]: how a sender tells the owner it waits for a slot.

pub mod body;
mod budget;
pub mod guard;
pub mod idempotency;
pub mod jobs;
mod owner;
pub mod policy;
pub mod seal;
mod slot;
pub mod trace;

pub use oncely_http::{headers, problem};

pub use guard::{
    Classified, Classifier, Execution, FreshAnswer, Guard, GuardedCall, UpstreamAnswer,
    UpstreamError, UpstreamFailure,
};
pub use idempotency::{IdempotencyLayer, IdempotencyService, ResponseFuture};
pub use jobs::{JobBoard, JobRequest, JobWorker, JobWorkerOptions};
pub use policy::{GuardWhen, KeyMode, PrincipalSource, RoutePolicies, RoutePolicy, UnitsRule};
pub use problem::{Problem, ProblemCode};
pub use seal::JobKey;
pub use slot::wait_for_slot;

/// Any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every answer (and of the requests the inner service receives).
pub type BoxBody = http_body_util::combinators::BoxBody<bytes::Bytes, BoxError>;
