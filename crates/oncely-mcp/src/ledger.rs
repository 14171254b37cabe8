//! Claim, wait and replay on the oncely [`Store`].
//!
//! This is the protocol-agnostic half of a guarded call: given the claim of one
//! intention, decide whether this caller executes it, replays it, joins it, or is told it
//! is still running. It is written against `oncely_store::Store` directly until
//! `oncely_tower::Guard::execute` lands; the MCP service only sees [`Decision`], so the
//! swap is local to this module.

use std::time::Duration;

use oncely_core::{ClaimSpec, Record, State, TakeOverOutcome};
use oncely_store::{Claim, Store, StoreError};
use tokio::time::Instant;

/// How a repeat got its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayKind {
    /// The original had completed before the repeat arrived.
    Replayed,
    /// The repeat waited for the original in flight.
    Joined,
}

impl ReplayKind {
    /// `replayed` or `joined`, as `Oncely-Status` and `_meta` show it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayKind::Replayed => "replayed",
            ReplayKind::Joined => "joined",
        }
    }
}

/// What a caller of a guarded call does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// This caller owns the record: execute, then complete or release it.
    Owner(Record),
    /// Answer from the completed record.
    Replay(Record, ReplayKind),
    /// The original still runs after `wait`.
    InFlight(Record),
    /// Nobody knows whether the original happened; a person must reconcile it.
    OutcomeUnknown(Record),
}

/// Claims `spec` and decides, waiting up to `wait` for an original in flight.
pub async fn decide(
    store: &dyn Store,
    spec: &ClaimSpec,
    wait: Duration,
) -> Result<Decision, StoreError> {
    let deadline = Instant::now() + wait;
    let mut last = None;
    // A few rounds: a released original lets the next claim own the record; a lapsed lease
    // is taken over; anything else answers at once.
    for _ in 0..8 {
        let record = match store.claim(spec).await? {
            Claim::Owned(r) => return Ok(Decision::Owner(r)),
            Claim::Existing(r) => r,
        };
        let record = match record.state {
            State::Completed => return Ok(Decision::Replay(record, ReplayKind::Replayed)),
            State::OutcomeUnknown => return Ok(Decision::OutcomeUnknown(record)),
            State::Released => continue,
            State::Processing => record,
        };
        if record.lease_lapsed(store.now().await?) {
            match store
                .take_over(&record.id, record.attempt, &spec.owner, spec.lease)
                .await
            {
                Ok(TakeOverOutcome::Owned(r)) => return Ok(Decision::Owner(r)),
                Ok(TakeOverOutcome::OutcomeUnknown(r)) => return Ok(Decision::OutcomeUnknown(r)),
                Err(StoreError::Transition(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let waited = store.wait_for(&record.id, left).await?;
        match waited.state {
            State::Completed => return Ok(Decision::Replay(waited, ReplayKind::Joined)),
            State::OutcomeUnknown => return Ok(Decision::OutcomeUnknown(waited)),
            State::Released => continue,
            State::Processing => {
                if Instant::now() >= deadline && !waited.lease_lapsed(store.now().await?) {
                    return Ok(Decision::InFlight(waited));
                }
                last = Some(waited);
            }
        }
    }
    match last {
        Some(r) => Ok(Decision::InFlight(r)),
        None => Err(StoreError::Unavailable(
            "the record kept changing state while it was claimed".into(),
        )),
    }
}
