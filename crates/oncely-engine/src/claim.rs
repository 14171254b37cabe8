//! The claim loop, carried out once for every claimant: a guarded call (the engine's
//! `execute`), a job's request and the job worker (`oncely-tower`'s jobs), and the
//! gateway's sweep for actions whose owner went away. It claims the record (or reads it,
//! for a claimant that does not claim), asks `oncely_core::decide` what to do with what
//! it found, and carries out the step: read the ledger's clock, wait on the record (for
//! a claimant that waits, within its `wait`), take the record over, or claim it again,
//! until a step ends it ([`Verdict`]). What differs between claimants is only how they
//! claim and take over ([`Claimer`]) and what they make of the verdict.
//!
//! Every store operation of the loop is bounded by the store itself
//! (`oncely_store::Bounded`, which wraps every store `oncely_store::open` hands out):
//! a claim or a take-over that lands after its bound is released unsent, a
//! `claim_with_task` that does stands (its worker runs it once). The loop adds no bound
//! of its own.
//!
//! A record whose owner runs in this process is never taken over from here, whatever the
//! ledger says of its lease (a store that stalled past the lease kept its renewals from
//! landing): the loop takes that as the store's own `LeaseHeld`, the one way a lease
//! held is handled.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use oncely_core::TransitionError;
use oncely_core::{decide, Claimant, Fingerprint, Record, Seen, Step, TakeOverOutcome, Timestamp};
use oncely_store::{Claim, Store, StoreError};
use tokio::time::Instant;

use crate::ledger::Live;
use crate::waits::Waits;

/// What claiming a record, or taking it over, got a claimant.
#[derive(Debug)]
pub enum Claimed<O> {
    /// The claimant owns the record now: its claim or its take-over won. `O` is what the
    /// claimant made of it (the engine's owner task started, a job's record).
    Owned(O),
    /// Someone else's record: `decide` says what the claimant does with it.
    Found(Record),
    /// The take-over found an action whose owner's lease lapsed: the store made it
    /// `outcome_unknown`.
    Unknown(Record),
    /// No record (a claimant that reads the record instead of claiming it found none).
    Gone,
}

impl From<Claim> for Claimed<Record> {
    fn from(claim: Claim) -> Claimed<Record> {
        match claim {
            Claim::Owned(record) => Claimed::Owned(record),
            Claim::Existing(record) => Claimed::Found(record),
        }
    }
}

impl From<TakeOverOutcome> for Claimed<Record> {
    fn from(taken: TakeOverOutcome) -> Claimed<Record> {
        match taken {
            TakeOverOutcome::Owned(record) => Claimed::Owned(record),
            TakeOverOutcome::OutcomeUnknown(record) => Claimed::Unknown(record),
        }
    }
}

/// How one claimant claims and takes over; the claim loop does the rest.
pub trait Claimer: Send {
    /// What the claimant makes of a record it owns.
    type Owned: Send;

    /// Claims the record (first, after a release, and once it is gone): a call with
    /// `Ledger::claim`, a job's request with `TaskQueue::claim_with_task`; the job worker
    /// and the sweep read it (they never own by claiming).
    fn claim(&mut self) -> BoxFuture<'_, Result<Claimed<Self::Owned>, StoreError>>;

    /// Takes `found` over: its owner's lease lapsed (`Ledger::take_over`, fenced by its
    /// attempt).
    fn take_over<'a>(
        &'a mut self,
        found: &'a Record,
    ) -> BoxFuture<'a, Result<Claimed<Self::Owned>, StoreError>>;
}

/// What a claimant brings to the loop.
#[derive(Debug, Clone, Copy)]
pub struct Claiming {
    /// Who claims.
    pub claimant: Claimant,
    /// The request's fingerprint; `None`: the found record's own (the job worker, the
    /// sweep, which bring no request of their own).
    pub fingerprint: Option<Fingerprint>,
    /// Until when a claimant that waits may wait (its `wait` from its start).
    pub deadline: Instant,
    /// The ledger's clock, when the claimant has just read it (the sweep reads it once
    /// for every record it looks at); used for the first record found.
    pub now: Option<Timestamp>,
}

/// How the claim loop ended.
#[derive(Debug)]
pub enum Verdict<O> {
    /// The claimant owns the record (its claim or its take-over won).
    Owned(O),
    /// `decide` gave a step the loop does not carry out: `Replay`, `Join`, `Own`, a
    /// `Refuse`, or, for a claimant that does not wait, `WaitUntil` (with the end of the
    /// owner's lease, or the ledger's time when the record has none).
    Decided {
        /// The step.
        step: Step,
        /// The record it was decided on.
        record: Record,
        /// Whether the claimant waited on the record (a completed one is then joined).
        waited: bool,
    },
    /// The take-over made the record `outcome_unknown` (an action whose owner went away).
    Unknown(Record),
    /// The take-over was refused because the lease is held (by an owner running in this
    /// process, or by the store's own observation of it), and the claimant does not wait
    /// or its wait is over.
    LeaseHeld(Record),
    /// The record is gone (for a claimant that reads it instead of claiming).
    Gone,
    /// The ledger failed or did not answer within its bound.
    Unavailable(StoreError),
}

/// How long a claimant whose take-over the store refused as `LeaseHeld` waits (on the
/// record, woken by its end) before it looks again, within its `wait`.
const LEASE_HELD_PAUSE: Duration = Duration::from_millis(200);

/// A waiter wakes this long after the owner's lease would lapse, to take over a dead
/// owner without waiting its whole `wait`.
const PAST_LAPSE: Duration = Duration::from_millis(20);

/// Each turn either ends or claims again; the cap only guards against a store that
/// keeps contradicting itself.
const MAX_CLAIMS: usize = 64;

/// The loop, on one engine's ledger, owners and shared waits.
pub(crate) struct ClaimLoop<'a> {
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) live: &'a Live,
    pub(crate) waits: &'a Waits,
}

impl ClaimLoop<'_> {
    /// Claims with `claimer` and carries out what `decide` says until a step ends it.
    pub(crate) async fn run<C: Claimer>(
        &self,
        claimer: &mut C,
        claiming: Claiming,
    ) -> Verdict<C::Owned> {
        let Claiming {
            claimant,
            fingerprint,
            deadline,
            now: mut clock,
        } = claiming;
        let mut waited = false;
        for _ in 0..MAX_CLAIMS {
            let mut record = match claimer.claim().await {
                Ok(Claimed::Owned(owned)) => return Verdict::Owned(owned),
                Ok(Claimed::Found(record)) => record,
                Ok(Claimed::Unknown(record)) => return Verdict::Unknown(record),
                Ok(Claimed::Gone) => return Verdict::Gone,
                Err(e) => return Verdict::Unavailable(e),
            };
            // The ledger's clock, read when the decision needs it (afresh for each record).
            let mut now = clock.take();
            loop {
                let wait_left = deadline.saturating_duration_since(Instant::now());
                let seen = Seen {
                    fingerprint: fingerprint.unwrap_or(record.fingerprint),
                    claimant,
                    waited,
                    wait_left,
                };
                match decide(&record, &seen, now) {
                    // Released while we looked (or waited): claim again, and execute (with
                    // the same downstream key) if the claim is won.
                    Step::ClaimAgain => break,
                    Step::ReadClock => match self.store.now().await {
                        Ok(n) => now = Some(n),
                        Err(e) => return Verdict::Unavailable(e),
                    },
                    Step::WaitUntil(lease_until) if claimant.waits() => {
                        // Wake up when the owner's lease would lapse, to take over a dead
                        // owner without waiting the whole `wait`.
                        let until_lapse = match (lease_until, now) {
                            (Some(l), Some(now)) => now.until(l) + PAST_LAPSE,
                            _ => wait_left,
                        };
                        waited = true;
                        record = match self.wait(&record, wait_left.min(until_lapse)).await {
                            Ok(Some(r)) => r,
                            Ok(None) => break,
                            Err(e) => return Verdict::Unavailable(e),
                        };
                        now = None;
                    }
                    Step::WaitUntil(lease_until) => {
                        return Verdict::Decided {
                            step: Step::WaitUntil(lease_until.or(now)),
                            record,
                            waited,
                        }
                    }
                    Step::TakeOver => {
                        let taken = if self.live.holds(&record) {
                            Err(StoreError::Transition(TransitionError::LeaseHeld {
                                id: record.id.clone(),
                            }))
                        } else {
                            claimer.take_over(&record).await
                        };
                        match taken {
                            Ok(Claimed::Owned(owned)) => return Verdict::Owned(owned),
                            Ok(Claimed::Unknown(r)) => return Verdict::Unknown(r),
                            Ok(Claimed::Found(r)) => {
                                record = r;
                                now = None;
                            }
                            Ok(Claimed::Gone) => break,
                            // The lease is held live (by an owner here, by the store's own
                            // observation of it, or while its server has not been up for a
                            // whole lease): wait as for a live lease, a while at a time,
                            // within `wait`.
                            Err(StoreError::Transition(TransitionError::LeaseHeld { .. })) => {
                                if !claimant.waits() || wait_left.is_zero() {
                                    return Verdict::LeaseHeld(record);
                                }
                                waited = true;
                                record =
                                    match self.wait(&record, wait_left.min(LEASE_HELD_PAUSE)).await
                                    {
                                        Ok(Some(r)) => r,
                                        Ok(None) => break,
                                        Err(e) => return Verdict::Unavailable(e),
                                    };
                                now = None;
                            }
                            // Someone else moved it first: look again.
                            Err(StoreError::Transition(_)) => {
                                match self.store.get(&record.id).await {
                                    Ok(Some(r)) => {
                                        record = r;
                                        now = None;
                                    }
                                    Ok(None) => break,
                                    Err(e) => return Verdict::Unavailable(e),
                                }
                            }
                            Err(e) => return Verdict::Unavailable(e),
                        }
                    }
                    step => {
                        return Verdict::Decided {
                            step,
                            record,
                            waited,
                        }
                    }
                }
            }
        }
        Verdict::Unavailable(StoreError::Unavailable(
            "the ledger kept changing under one claim".into(),
        ))
    }

    /// Waits on `record` for at most `timeout`; `None` when it is gone.
    async fn wait(&self, record: &Record, timeout: Duration) -> Result<Option<Record>, StoreError> {
        match self.waits.wait(self.store, &record.id, timeout).await {
            Ok(r) => Ok(Some(r)),
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
