//! oncely's one HTTP toolkit: what every part of the gateway (HTTP routes, jobs, MCP
//! endpoints, webhook endpoints and deliveries, the admin API) must do alike when it
//! speaks HTTP, kept in one place so that the copies cannot drift.
//!
//! ```
//! use oncely_http::problem::{Problem, ProblemCode};
//!
//! let res = Problem::new(ProblemCode::InFlight, "still running").with_retry_after(2).render();
//! assert_eq!(res.status(), 409);
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! assert_eq!(res.headers()["retry-after"], "2");
//! let doc: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
//! assert_eq!(doc["type"], "urn:oncely:problem:in_flight");
//! assert_eq!(doc["code"], "in_flight");
//! ```
//!
//! # Layout
//!
//! - [`problem`]: every error answer oncely writes itself, `application/problem+json`
//!   (RFC 9457) with a `code` ([`Problem`], [`ProblemCode`]); and the names of oncely's
//!   headers.
//! - [`headers`]: which headers are hop-by-hop, and what a stored answer keeps and a
//!   replay carries.
//! - `client` (feature `client`): the upstream client with its TLS roots.
//! - [`request_log`]: the one log line of a guarded request and its count in
//!   `oncely_requests_total`.

#![warn(missing_docs)]

#[cfg(feature = "client")]
pub mod client;
pub mod dialect;
pub mod headers;
pub mod problem;
pub mod request_log;

pub use dialect::Dialect;
pub use problem::{Problem, ProblemCode};

pub use oncely_core::BoxError;

/// The one boxed HTTP body of the workspace: every answer oncely writes or passes on
/// (re-exported as `oncely_tower::BoxBody`).
pub type BoxBody = http_body_util::combinators::BoxBody<bytes::Bytes, BoxError>;

/// A whole body of these bytes.
pub fn full(bytes: impl Into<bytes::Bytes>) -> BoxBody {
    use http_body_util::BodyExt;
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}
