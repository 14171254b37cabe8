//! The oncely engine: what makes a call safe to repeat, with no protocol in it.
//!
//! [`Engine::execute`] claims a call's record on the ledger and either runs the upstream
//! call as its owner (on a task the caller does not own, with lease renewal, a fenced
//! completion retried while the record is still its own, and the answer streamed to the
//! caller while it is recorded), or answers from the ledger (replay, join, refusal).
//! What a claimant does with the record it found is decided by `oncely_core::decide`.
//!
//! The engine knows no HTTP: an answer is plain data (a status as `u16`, the headers a
//! stored answer keeps as `(name, value)` pairs, a body as a [`futures::Stream`] of
//! [`bytes::Bytes`]). The protocol layers (`oncely-tower` for HTTP routes and queued
//! jobs, `oncely-mcp` through it) convert from and to their own types at their edge;
//! they depend on the engine, never the reverse.
//!
//! # Layout
//!
//! - [`call`]: what goes in and comes out, in plain data ([`GuardedCall`],
//!   [`UpstreamAnswer`], [`Head`], [`Execution`]).
//! - [`engine`]: [`Engine`]: a call's claim and its answer (replay, join, refusal), and
//!   the start of its owner task.
//! - [`claim`]: the claim loop every claimant (a call, a job's request, the job worker,
//!   the sweep) goes through: claim, decide, read the clock, wait, take over, claim
//!   again ([`Claimer`], [`Verdict`]).
//! - `waits` (private): waits on a record shared by the claimants of this instance.
//! - `owner` (private): the owner task.
//! - `ledger` (private): ledger operations bounded in time, an owner's writes retried
//!   while it owns the record, its lease kept renewed.
//! - `tally` (private): repeats counted in memory and written in sums.
//! - `budget` (private): what answers in flight may hold.
//! - [`stream`]: the body types, [`BodyStream`] in and [`CallerBody`] out.
//! - [`delivery`]: whether an answer reached its caller ([`Delivery`]), the evidence a key
//!   made up for a retry needs ([`CallChurn`]).
//! - [`sweep`]: the periodic work on records whose owner went away (orphaned actions
//!   become `outcome_unknown`, orphaned records undelivered), run by whatever embeds the
//!   engine ([`Engine::sweeping`]).

mod budget;
pub mod call;
pub mod claim;
pub mod delivery;
pub mod engine;
mod ledger;
mod owner;
pub mod stream;
pub mod sweep;
mod tally;
mod tasks;
mod waits;

pub use call::{
    Classified, Classifier, Execution, FreshAnswer, GuardedCall, Head, SpanRef, UpstreamAnswer,
    UpstreamError, UpstreamFailure, UpstreamFuture,
};
pub use claim::{Claimed, Claimer, Claiming, Verdict};
pub use delivery::{CallChurn, Delivery};
pub use engine::{retry_after, Engine, DEFAULT_MAX_INFLIGHT_BYTES};
pub use ledger::STORE_ANSWER;
pub use stream::{BodyStream, CallerBody};
pub use tally::REPEAT_FLUSH;
pub use tasks::TaskToken;

pub use oncely_core::BoxError;
