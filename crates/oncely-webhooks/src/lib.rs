//! Webhook signature verification for oncely's webhook ingress.
//!
//! A webhook sender proves a delivery is its own by signing the body with a shared secret.
//! This crate checks those signatures exactly as each provider specifies them, with
//! constant-time comparison, several secrets at once (so a secret can be rotated without
//! refusing deliveries signed with the old one), and a timestamp tolerance that refuses
//! both stale and future-dated deliveries. It does no I/O: the ingress hands it the
//! headers, the raw body and the current time, and gets back the event id to claim.
//!
//! ```
//! use std::time::Duration;
//! use oncely_webhooks::{sign, Scheme, Secrets, Verifier};
//!
//! let scheme: Scheme = "standard".parse().unwrap();
//! // The variable named by `secret_env` holds one or more secrets, space-separated.
//! let secrets = Secrets::parse(&scheme, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
//! let body = br#"{"test": 2432232314}"#;
//! let headers = sign(&scheme, secrets.primary(), "msg_1", 1_614_265_330, body);
//!
//! let verifier = Verifier::new(scheme, secrets, Duration::from_secs(300));
//! let verified = verifier.verify(&headers, body, 1_614_265_330).unwrap();
//! assert_eq!(verified.event_id.as_deref(), Some("msg_1"));
//! assert_eq!(verified.timestamp, Some(1_614_265_330));
//! ```
//!
//! # The ingress
//!
//! On top of verification the crate runs the whole webhook path of the gateway:
//! [`WebhookEndpoint`] (verify, claim the event id once, queue the delivery durably in
//! one transaction, then answer 200 `fresh` or `duplicate`), [`DeliveryWorker`] (deliver
//! each queued event to `deliver_to` with `Idempotency-Key: EVENT_ID`, retry with
//! backoff, dead-letter), and [`ops`] (list and redeliver dead deliveries, admin routes).
//!
//! # Layout
//!
//! - [`error`]: [`ConfigError`], the error of everything this crate reads from configuration.
//! - [`scheme`]: the scheme names of `verify = "..."` and the generic scheme's settings.
//! - [`secret`]: secrets as read from the variable named by `secret_env`.
//! - [`headers`]: [`HeaderLookup`], how the verifier reads request headers.
//! - [`parse`]: the parsers of each signature header (public so the fuzz target reaches them).
//! - [`event_id`]: where a delivery's event id comes from (`json:/id`, `header:NAME`).
//! - [`mod@verify`]: [`verify()`], [`Verifier`], [`Verified`] and [`VerifyError`].
//! - [`mod@sign`]: [`sign()`], the sender's side, for tests and the demo.
//! - [`ingress`]: [`WebhookConfig`], [`WebhookEndpoint`].
//! - [`queue`]: [`queue::TASK_KIND`] and [`Waker`], what the ingress, the worker and the
//!   operations share about the store's queue.
//! - [`worker`]: [`DeliveryWorker`], [`WorkerOptions`].
//! - [`ops`]: [`list_dead`], [`redeliver`], [`admin_router`].

#![warn(missing_docs)]

pub mod error;
pub mod event_id;
pub mod headers;
pub mod ingress;
pub mod ops;
pub mod parse;
pub mod queue;
pub mod scheme;
pub mod secret;
pub mod sign;
pub mod verify;
pub mod worker;

pub use error::ConfigError;
pub use event_id::EventIdSource;
pub use headers::HeaderLookup;
pub use ingress::{WebhookConfig, WebhookEndpoint};
pub use ops::{admin_router, list_dead, redeliver, DeadDelivery};
pub use queue::Waker;
pub use scheme::{Encoding, HmacConfig, Scheme};
pub use secret::{Secret, Secrets};
pub use sign::sign;
pub use verify::{verify, Verified, Verifier, VerifyError, DEFAULT_TOLERANCE};
pub use worker::{DeliveryEnd, DeliverySpans, DeliveryWorker, WorkerOptions};
