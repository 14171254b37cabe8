//! The pure heart of oncely: what an intention is and what may happen to it.
//!
//! Nothing here does I/O. The stores, the tower layer and the gateway build on these
//! types so that every backend and every entry point (HTTP routes, MCP tools, webhooks)
//! agrees on the same rules.
//!
//! # Layout
//!
//! - [`key`]: `Idempotency-Key` validation, scopes and downstream keys.
//! - [`backoff`]: the one exponential backoff (with full jitter) of every retry loop.
//! - [`canon`]: canonical JSON (RFC 8785, numbers as exact decimals).
//! - [`fingerprint`]: the SHA-256 request fingerprint.
//! - [`multipart`], [`form`]: `multipart/form-data` and `application/x-www-form-urlencoded`
//!   bodies read as their parts and pairs, for the fingerprint.
//! - [`policy`]: operation classes and which upstream answers are kept.
//! - [`decide`](mod@decide): what a claimant does with the record it found (the claim table).
//! - [`identity`]: who asks for what: an intention's scope, key, fingerprint, class,
//!   route, principal and workflow id, declared once.
//! - [`record`]: the ledger record, its states, and every transition as a pure function.
//! - [`errors`]: an error's text with its sources, and [`BoxError`].
//! - [`units`]: durations (`500ms`, `3h`, `7d`), sizes (`10MiB`) and timestamps.

pub mod backoff;
pub mod canon;
pub mod decide;
pub mod errors;
pub mod fingerprint;
pub mod form;
pub mod identity;
pub mod key;
pub mod multipart;
pub mod policy;
pub mod record;
pub mod units;

pub use decide::{decide, Claimant, Refusal, Seen, Step, SWEEP_GRACE};
pub use errors::{error_chain, BoxError};
pub use fingerprint::{canonical_json, Fingerprint, FingerprintBuilder};
pub use identity::Identity;
pub use key::{principal_hash, ClientKey, DownstreamKey, KeyError, Scope};
pub use policy::{is_storable, Class, Disposition, UpstreamResult};
pub use record::{
    decide_claim, ClaimDecision, ClaimSpec, Completion, Fence, Record, RecordId, Resolution, State,
    StoredResponse, TakeOverOutcome, TransitionError,
};
pub use units::{parse_duration, parse_size, Timestamp};
