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
//! render.principal = Arc::new(PrincipalSource::None); // one tenant
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
//! An application that embeds the layer runs the engine's sweep beside it (orphaned
//! actions become `outcome_unknown` once their owner's lease lapsed, orphaned records
//! undelivered for keys made up for each attempt), as the gateway does:
//! `tokio::spawn(async move { guard.engine().sweeping(churn_of, stop).await })`, with
//! `churn_of` the churn windows of a record's route (`oncely_engine::sweep::ChurnOf`).
//!
//! # Layout
//!
//! The engine itself (claim, owner task, repeat counting, in-flight budget) is the crate
//! `oncely-engine`, which knows no HTTP type; this crate is its HTTP face. Modules depend
//! on each other in one direction: `guard` on the engine, `jobs` on `guard`, the layer
//! (`idempotency`) on both.
//!
//! - [`policy`]: what a guarded route is ([`RoutePolicy`]) and how one is found per
//!   request ([`RoutePolicies`]).
//! - [`sources`]: the extension points of a route, as traits: where the key comes from
//!   ([`MakeKey`]), who the caller is ([`MakePrincipal`]), what a call is worth
//!   ([`MakeUnits`]).
//! - [`guard`]: the HTTP edge of the engine: [`Guard::execute`] claims, runs the owner's
//!   call on its own task, waits, replays, refuses (in `oncely_engine`); it answers an
//!   [`Execution`] with an HTTP status, headers and body.
//! - [`idempotency`]: the tower layer, a thin translation of requests into
//!   [`GuardedCall`]s and of [`Execution`]s into responses.
//! - [`jobs`]: `job` routes: the durable queue's side of the guard ([`Guard::submit_job`]),
//!   the [`JobWorker`] that runs queued jobs, and `/_oncely/jobs/ID`; `job_board`
//!   (private): what the layer and the worker share ([`JobBoard`]).
//! - [`seal`]: what a queued job keeps is encrypted with a [`JobKey`] before the store
//!   sees it.
//! - [`headers`], [`problem`]: re-exported from `oncely-http` (the one header policy;
//!   the gateway's own errors, `application/problem+json`).
//! - [`trace`]: W3C trace context in and out, and the spans of guarded requests, handed
//!   to a [`SpanSink`](trace::SpanSink) (the binary's exports them over OTLP).
//! - [`body`]: boxing bodies, and the channel an owner streams its answer through.
//! - `client` (feature `client`): the upstream client, the only place a failed send is
//!   classified.
//! - [`facts`]: what is read of a request once ([`RequestFacts`], [`read_body`]) and the
//!   one builder of a [`GuardedCall`] ([`RoutePolicy::guarded_call`]).
//! - `upstream` (private): the owner's call to the inner service, marked [`OwnerSend`];
//!   `log` (private): the request log line.

pub mod body;
#[cfg(feature = "client")]
pub mod client;
mod coding;
pub mod facts;
pub mod guard;
pub mod idempotency;
mod job_board;
pub mod jobs;
mod log;
pub mod policy;
pub mod seal;
pub mod sources;
pub mod trace;
mod upstream;

pub use oncely_http::{headers, problem};

pub use facts::{read_body, RequestFacts};
pub use guard::{
    AnswerFacts, Classified, Classifier, Execution, FreshResponse, Guard, GuardedCall,
    UpstreamCall, UpstreamError, UpstreamFailure, UpstreamResponse,
};
pub use idempotency::{IdempotencyLayer, IdempotencyService, ResponseFuture};
pub use job_board::JobBoard;
pub use jobs::{JobRequest, JobWorker, JobWorkerOptions};
pub use oncely_engine::STORE_ANSWER;
pub use oncely_http::Dialect;
pub use policy::{
    Concurrency, GuardWhen, KeyMode, PrincipalSource, RoutePolicies, RoutePolicy, UnitsRule,
};
pub use problem::{Problem, ProblemCode};
pub use seal::JobKey;
pub use sources::UnitsOf;
pub use sources::{workflow_id, MakeKey, MakePrincipal, MakeUnits, RequestHead};
pub use upstream::{upstream_error, OwnerSend};

/// The body type of every answer (and of the requests the inner service receives).
pub use oncely_http::BoxBody;
pub use oncely_http::BoxError;
