//! The ledger record and its transitions, as pure functions. A claim ([`ClaimSpec`]) and
//! its [`Record`] each hold the intention's [`Identity`] and dereference to it.
//!
//! ```text
//!             claim (new)                complete(owner, attempt)
//!   (none) ───────────────► processing ─────────────────────────► completed ──(expires_at)──► (none)
//!                               │  │  release(owner, attempt, window)  ▲
//!                               │  └───────────────────────► released ─┘ (next claim reuses the row;
//!                               │                                 after expires_at: (none), like completed)
//!                               │  lease lapsed: write/job → processing (attempt+1, new owner)
//!                               └─ ambiguous failure, or lease lapsed on an action ─► outcome_unknown
//!   outcome_unknown ── resolve(completed | released) by an operator or a reconciler
//! ```
//!
//! Every store applies exactly these rules: the memory and SQLite stores call these
//! functions, the PostgreSQL store mirrors them in conditional SQL, and one conformance
//! suite checks that they agree. `attempt` is the fencing token: a transition made by an
//! owner names its attempt, and a stale owner's write is refused.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;

use crate::identity::Identity;
use crate::units::Timestamp;

/// An opaque record id, as shown in `Oncely-Record`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId(pub String);

impl RecordId {
    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a record is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// An owner is executing it now.
    Processing,
    /// Done; its response is replayed until `expires_at`.
    Completed,
    /// The attempt failed harmlessly; the next identical request executes again.
    Released,
    /// Nobody knows whether the action happened; repeats are refused until resolved.
    OutcomeUnknown,
}

impl State {
    /// The state's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Processing => "processing",
            State::Completed => "completed",
            State::Released => "released",
            State::OutcomeUnknown => "outcome_unknown",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<State, String> {
        Ok(match s {
            "processing" => State::Processing,
            "completed" => State::Completed,
            "released" => State::Released,
            "outcome_unknown" => State::OutcomeUnknown,
            other => {
                return Err(format!(
                "unknown state {other:?} (use processing, completed, outcome_unknown or released)"
            ))
            }
        })
    }
}

/// A stored upstream answer: what duplicates get back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredResponse {
    /// HTTP status.
    pub status: u16,
    /// The headers worth replaying, in order.
    pub headers: Vec<(String, String)>,
    /// The body; `None` when it was larger than `max_response` and was not kept.
    /// `Bytes`, so that every replay and join of one answer shares one copy of it.
    pub body: Option<Bytes>,
}

/// Derefs `$holder` to the [`Identity`] it holds in its `identity` field.
macro_rules! holds_identity {
    ($holder:ty) => {
        impl std::ops::Deref for $holder {
            type Target = Identity;
            fn deref(&self) -> &Identity {
                &self.identity
            }
        }

        impl std::ops::DerefMut for $holder {
            fn deref_mut(&mut self) -> &mut Identity {
                &mut self.identity
            }
        }
    };
}
holds_identity!(Record);
holds_identity!(ClaimSpec);

/// One ledger record: an intention's [`Identity`] (it dereferences to it) and where its
/// execution stands. See the module docs for its states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Opaque id.
    pub id: RecordId,
    /// The intention: scope, key, fingerprint, class, route, principal, workflow id.
    pub identity: Identity,
    /// Current state.
    pub state: State,
    /// Who executes it now (while `processing`).
    pub owner: Option<String>,
    /// The fencing token: 1 on the first execution, +1 on each re-execution.
    pub attempt: u32,
    /// Until when the owner's claim holds without renewal.
    pub lease_until: Option<Timestamp>,
    /// When the record was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// When it was completed.
    pub completed_at: Option<Timestamp>,
    /// Until when a completed record is replayed.
    pub expires_at: Option<Timestamp>,
    /// The stored answer (completed records).
    pub response: Option<StoredResponse>,
    /// Billing units charged for the one execution.
    pub units: u64,
    /// How many repeats were answered from this record.
    pub repeats: u64,
    /// Units those repeats would have cost.
    pub repeat_units: u64,
    /// The upstream's request id, for reconciliation.
    pub provider_request_id: Option<String>,
    /// Why the last attempt failed, or why the record changed state.
    pub last_error: Option<String>,
    /// The span that executed it (`TRACEID-SPANID`, hex, when traces were on): a
    /// replay's or a join's span links to it, on any instance.
    pub trace: Option<String>,
}

impl Record {
    /// A completed record whose replay window has not ended at `now`.
    pub fn is_replayable(&self, now: Timestamp) -> bool {
        self.state == State::Completed && self.expires_at.is_some_and(|e| e > now)
    }

    /// A completed record past its window, or a released one past the window it was
    /// released with: the key is free again (a different request under it executes).
    /// A released record without `expires_at` (released before releases carried their
    /// window) never expires.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        match self.state {
            State::Completed => self.expires_at.is_none_or(|e| e <= now),
            State::Released => self.expires_at.is_some_and(|e| e <= now),
            _ => false,
        }
    }

    /// A processing record whose owner stopped renewing its lease.
    pub fn lease_lapsed(&self, now: Timestamp) -> bool {
        self.state == State::Processing && self.lease_until.is_none_or(|l| l <= now)
    }

    /// A processing record whose lease has been past for a whole lease more (its length
    /// as last granted: `lease_until` less `updated_at`), and at least `at_least`: its
    /// owner has missed every renewal of two leases. A record without a lease never is.
    pub fn lease_lapsed_long_ago(&self, now: Timestamp, at_least: Duration) -> bool {
        let Some(until) = self.lease_until.filter(|_| self.state == State::Processing) else {
            return false;
        };
        let length = (until.0 - self.updated_at.0).max(0);
        let grace = length.max(at_least.as_millis() as i64);
        now.0 >= until.0.saturating_add(grace)
    }

    /// The fence an owner of this record writes with.
    pub fn fence(&self) -> Option<Fence> {
        Some(Fence {
            id: self.id.clone(),
            owner: self.owner.clone()?,
            attempt: self.attempt,
        })
    }
}

/// What a claimant brings: the identity of the intention (it dereferences to it) and who
/// would execute it, for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSpec {
    /// The intention.
    pub identity: Identity,
    /// Who would execute (an instance id plus a nonce).
    pub owner: String,
    /// How long the claim lasts without renewal.
    pub lease: Duration,
}

impl ClaimSpec {
    /// The lease of a claim whose route names none: a route's default (the contract's
    /// 30 s), and a webhook event's, whose record is completed in its claim's transaction.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
}

/// Who may write to a processing record: the owner of one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The record.
    pub id: RecordId,
    /// The owner that claimed it.
    pub owner: String,
    /// The attempt the owner executes.
    pub attempt: u32,
}

/// A successful execution to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The answer to replay.
    pub response: StoredResponse,
    /// Billing units.
    pub units: u64,
    /// How long to replay it from now.
    pub window: Duration,
    /// An earlier end of the window that the upstream asked for
    /// (`Oncely-Replay-Until` / `Oncely-Replay-Seconds`).
    pub replay_until: Option<Timestamp>,
    /// The upstream's request id.
    pub provider_request_id: Option<String>,
    /// The span that executed it (`TRACEID-SPANID`, hex), when traces are on.
    pub trace: Option<String>,
}

/// An operator's or reconciler's verdict on an `outcome_unknown` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The action did not happen: the next identical request executes afresh.
    Released {
        /// How long the released record is kept from now (its route's window): until then
        /// the same request executes afresh and a different one under the same key gets
        /// 422; after it, the record expires and is purged like any other.
        window: Duration,
        /// Why (logged and kept in `last_error`).
        reason: String,
    },
    /// The action happened: duplicates get this response.
    Completed {
        /// The response to replay.
        response: StoredResponse,
        /// How long to replay it from now.
        window: Duration,
        /// Why (logged and kept in `last_error`).
        reason: String,
    },
}

/// Why a transition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransitionError {
    /// The writer is not the record's current owner, or names another attempt: a stale
    /// owner after a take-over.
    #[error(
        "record {id} is fenced: attempt {attempt} by another owner or a newer attempt owns it"
    )]
    Fenced {
        /// The record.
        id: RecordId,
        /// The attempt the writer named.
        attempt: u32,
    },
    /// The record is not in a state that allows this transition.
    #[error("record {id} is {state}, which does not allow {action}")]
    WrongState {
        /// The record.
        id: RecordId,
        /// Its state.
        state: State,
        /// What was attempted.
        action: &'static str,
    },
    /// A take-over was asked while the owner's lease still holds.
    #[error("record {id} is still leased by its owner")]
    LeaseHeld {
        /// The record.
        id: RecordId,
    },
}

/// What a claim should do given the row that already holds `(scope, key)`, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimDecision {
    /// No row: insert a new processing record.
    Insert,
    /// A released row with the same fingerprint: execute again (attempt + 1, same id).
    Reclaim,
    /// A completed row past its window: a new intention under the same key (new id,
    /// attempt 1).
    Renew,
    /// Anything else: the claimant gets the existing record (replay, wait, 409, 422).
    Existing,
}

/// Decides a claim. Pure: the stores run it inside their atomic claim.
pub fn decide_claim(existing: Option<&Record>, spec: &ClaimSpec, now: Timestamp) -> ClaimDecision {
    match existing {
        None => ClaimDecision::Insert,
        Some(r) if r.is_expired(now) => ClaimDecision::Renew,
        Some(r) if r.state == State::Released && r.fingerprint == spec.fingerprint => {
            ClaimDecision::Reclaim
        }
        Some(_) => ClaimDecision::Existing,
    }
}

/// What a take-over did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeOverOutcome {
    /// The new owner executes again (write, job): attempt + 1.
    Owned(Record),
    /// The lost call may have acted (action): the record is now `outcome_unknown`.
    OutcomeUnknown(Record),
}

impl Record {
    /// A new processing record for `spec`, owned by `spec.owner` at attempt 1.
    pub fn new_claim(id: RecordId, spec: &ClaimSpec, now: Timestamp) -> Record {
        Record {
            id,
            identity: spec.identity.clone(),
            state: State::Processing,
            owner: Some(spec.owner.clone()),
            attempt: 1,
            lease_until: Some(now.plus(spec.lease)),
            created_at: now,
            updated_at: now,
            completed_at: None,
            expires_at: None,
            response: None,
            units: 0,
            repeats: 0,
            repeat_units: 0,
            provider_request_id: None,
            last_error: None,
            trace: None,
        }
    }

    /// Applies a claim decision of [`decide_claim`] that makes the claimant the owner.
    /// `new_id` is used for [`ClaimDecision::Renew`] (a new intention gets a new id).
    pub fn reclaim(
        &mut self,
        decision: ClaimDecision,
        new_id: RecordId,
        spec: &ClaimSpec,
        now: Timestamp,
    ) {
        match decision {
            ClaimDecision::Renew => *self = Record::new_claim(new_id, spec, now),
            _ => {
                self.state = State::Processing;
                self.owner = Some(spec.owner.clone());
                self.attempt += 1;
                self.lease_until = Some(now.plus(spec.lease));
                self.expires_at = None;
                self.updated_at = now;
                self.identity.workflow_id = spec
                    .workflow_id
                    .clone()
                    .or(self.identity.workflow_id.take());
            }
        }
    }

    /// Whether `fence`'s own transition into `state` is already applied (the same owner
    /// and attempt, in that state): that transition retried after its answer was lost
    /// although it was written. It is answered as written, not refused, so its owner
    /// does not take a write of its own for someone else's.
    pub fn applied(&self, fence: &Fence, state: State) -> bool {
        self.state == state
            && self.attempt == fence.attempt
            && self.owner.as_deref() == Some(fence.owner.as_str())
    }

    fn check_fence(&self, fence: &Fence, action: &'static str) -> Result<(), TransitionError> {
        if self.state != State::Processing {
            // A stale owner whose record was taken over and finished is fenced out, not
            // told about a state it no longer owns.
            if self.attempt != fence.attempt || self.owner.as_deref() != Some(&fence.owner) {
                return Err(TransitionError::Fenced {
                    id: self.id.clone(),
                    attempt: fence.attempt,
                });
            }
            return Err(TransitionError::WrongState {
                id: self.id.clone(),
                state: self.state,
                action,
            });
        }
        if self.attempt != fence.attempt || self.owner.as_deref() != Some(&fence.owner) {
            return Err(TransitionError::Fenced {
                id: self.id.clone(),
                attempt: fence.attempt,
            });
        }
        Ok(())
    }

    /// The owner stores its answer: processing → completed.
    pub fn complete(
        &mut self,
        fence: &Fence,
        c: Completion,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        if self.applied(fence, State::Completed) {
            return Ok(());
        }
        self.check_fence(fence, "complete")?;
        let mut expires = now.plus(c.window);
        if let Some(until) = c.replay_until {
            expires = expires.min(until);
        }
        self.state = State::Completed;
        self.lease_until = None;
        self.completed_at = Some(now);
        self.expires_at = Some(expires);
        self.response = Some(c.response);
        self.units = c.units;
        self.provider_request_id = c.provider_request_id.or(self.provider_request_id.take());
        self.trace = c.trace.or(self.trace.take());
        self.updated_at = now;
        self.last_error = None;
        Ok(())
    }

    /// The owner gives up harmlessly: processing → released. The record expires after
    /// `window` like a completed one: until then the same request executes again under
    /// it and a different one is refused; after, the key is free.
    pub fn release(
        &mut self,
        fence: &Fence,
        error: Option<String>,
        window: Duration,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        if self.applied(fence, State::Released) {
            return Ok(());
        }
        self.check_fence(fence, "release")?;
        self.state = State::Released;
        self.lease_until = None;
        self.expires_at = Some(now.plus(window));
        self.updated_at = now;
        self.last_error = error;
        Ok(())
    }

    /// The owner cannot know whether its action happened: processing → outcome_unknown.
    pub fn mark_unknown(
        &mut self,
        fence: &Fence,
        error: String,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        if self.applied(fence, State::OutcomeUnknown) {
            return Ok(());
        }
        self.check_fence(fence, "mark_unknown")?;
        self.state = State::OutcomeUnknown;
        self.lease_until = None;
        self.updated_at = now;
        self.last_error = Some(error);
        Ok(())
    }

    /// The owner extends its lease while its upstream call runs.
    pub fn renew(
        &mut self,
        fence: &Fence,
        lease: Duration,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        self.check_fence(fence, "renew")?;
        self.lease_until = Some(now.plus(lease));
        self.updated_at = now;
        Ok(())
    }

    /// Another owner takes over a processing record whose lease lapsed. `expected_attempt`
    /// is the attempt the taker saw, so that two takers cannot both win.
    pub fn take_over(
        &mut self,
        expected_attempt: u32,
        owner: &str,
        lease: Duration,
        now: Timestamp,
    ) -> Result<TakeOverOutcome, TransitionError> {
        if self.state != State::Processing {
            return Err(TransitionError::WrongState {
                id: self.id.clone(),
                state: self.state,
                action: "take_over",
            });
        }
        if self.attempt != expected_attempt {
            return Err(TransitionError::Fenced {
                id: self.id.clone(),
                attempt: expected_attempt,
            });
        }
        if !self.lease_lapsed(now) {
            return Err(TransitionError::LeaseHeld {
                id: self.id.clone(),
            });
        }
        self.updated_at = now;
        if self.class.reexecutes_after_lapse() {
            self.owner = Some(owner.to_string());
            self.attempt += 1;
            self.lease_until = Some(now.plus(lease));
            self.last_error = Some(format!(
                "owner's lease lapsed during attempt {expected_attempt}; executing again"
            ));
            Ok(TakeOverOutcome::Owned(self.clone()))
        } else {
            self.state = State::OutcomeUnknown;
            self.lease_until = None;
            self.last_error = Some(format!(
                "owner's lease lapsed during attempt {expected_attempt}; the action may have happened"
            ));
            Ok(TakeOverOutcome::OutcomeUnknown(self.clone()))
        }
    }

    /// Reconciliation: outcome_unknown → completed or released.
    pub fn resolve(
        &mut self,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        if self.state != State::OutcomeUnknown {
            return Err(TransitionError::WrongState {
                id: self.id.clone(),
                state: self.state,
                action: "resolve",
            });
        }
        self.updated_at = now;
        self.owner = None;
        match resolution {
            Resolution::Released { window, reason } => {
                self.state = State::Released;
                self.expires_at = Some(now.plus(window));
                self.last_error = Some(reason);
            }
            Resolution::Completed {
                response,
                window,
                reason,
            } => {
                self.state = State::Completed;
                self.completed_at = Some(now);
                self.expires_at = Some(now.plus(window));
                self.response = Some(response);
                self.last_error = Some(reason);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Class;
    use crate::FingerprintBuilder;

    const LEASE: Duration = Duration::from_secs(30);
    const WINDOW: Duration = Duration::from_secs(3 * 3600);

    fn spec(class: Class, owner: &str) -> ClaimSpec {
        let fingerprint = FingerprintBuilder::new("p", "POST", "/x").body(b"{}", &[]);
        ClaimSpec {
            identity: Identity::new(
                "p".into(),
                "POST /x".into(),
                class,
                Some("k".into()),
                fingerprint,
                None,
            ),
            owner: owner.into(),
            lease: LEASE,
        }
    }

    fn claimed(class: Class) -> Record {
        Record::new_claim(RecordId("r1".into()), &spec(class, "a"), Timestamp(1_000))
    }

    fn completion() -> Completion {
        Completion {
            response: StoredResponse {
                status: 201,
                headers: vec![("content-type".into(), "application/json".into())],
                body: Some(Bytes::from_static(b"{}")),
            },
            units: 7,
            window: WINDOW,
            replay_until: None,
            provider_request_id: Some("req_1".into()),
            trace: None,
        }
    }

    #[test]
    fn claim_decisions() {
        let s = spec(Class::Write, "b");
        let now = Timestamp(2_000);
        assert_eq!(decide_claim(None, &s, now), ClaimDecision::Insert);
        let mut r = claimed(Class::Write);
        assert_eq!(decide_claim(Some(&r), &s, now), ClaimDecision::Existing);
        r.release(&r.fence().unwrap(), None, WINDOW, now).unwrap();
        assert_eq!(r.expires_at, Some(now.plus(WINDOW)));
        assert_eq!(decide_claim(Some(&r), &s, now), ClaimDecision::Reclaim);
        let mut other = s.clone();
        other.fingerprint = FingerprintBuilder::new("p", "POST", "/x").body(b"{\"a\":1}", &[]);
        assert_eq!(
            decide_claim(Some(&r), &other, now),
            ClaimDecision::Existing,
            "a different body under a released key is refused, not run"
        );
        let after = now.plus(WINDOW);
        assert!(r.is_expired(after));
        assert_eq!(
            decide_claim(Some(&r), &other, after),
            ClaimDecision::Renew,
            "after its window a released key is free for a new request"
        );
        assert_eq!(decide_claim(Some(&r), &s, after), ClaimDecision::Renew);
        let mut done = claimed(Class::Write);
        done.complete(&done.fence().unwrap(), completion(), now)
            .unwrap();
        assert_eq!(decide_claim(Some(&done), &s, now), ClaimDecision::Existing);
        let later = now.plus(WINDOW);
        assert_eq!(decide_claim(Some(&done), &s, later), ClaimDecision::Renew);
        let mut unknown = claimed(Class::Action);
        unknown
            .mark_unknown(&unknown.fence().unwrap(), "timeout".into(), now)
            .unwrap();
        assert_eq!(
            decide_claim(Some(&unknown), &s, later.plus(WINDOW)),
            ClaimDecision::Existing,
            "outcome_unknown never expires by itself"
        );
    }

    #[test]
    fn reclaim_keeps_the_id_and_bumps_the_attempt() {
        let mut r = claimed(Class::Write);
        r.release(
            &r.fence().unwrap(),
            Some("502".into()),
            WINDOW,
            Timestamp(2_000),
        )
        .unwrap();
        let s = spec(Class::Write, "b");
        r.reclaim(
            ClaimDecision::Reclaim,
            RecordId("new".into()),
            &s,
            Timestamp(3_000),
        );
        assert_eq!(r.id.as_str(), "r1");
        assert_eq!(r.attempt, 2);
        assert_eq!(r.state, State::Processing);
        assert_eq!(r.owner.as_deref(), Some("b"));
        assert_eq!(r.lease_until, Some(Timestamp(3_000).plus(LEASE)));
    }

    #[test]
    fn renew_after_expiry_is_a_new_record() {
        let mut r = claimed(Class::Write);
        r.complete(&r.fence().unwrap(), completion(), Timestamp(2_000))
            .unwrap();
        r.repeats = 3;
        let s = spec(Class::Write, "b");
        r.reclaim(
            ClaimDecision::Renew,
            RecordId("r2".into()),
            &s,
            Timestamp(2_000).plus(WINDOW),
        );
        assert_eq!(r.id.as_str(), "r2");
        assert_eq!(r.attempt, 1);
        assert_eq!(r.repeats, 0);
        assert_eq!(r.response, None);
    }

    #[test]
    fn complete_stores_the_answer_and_window() {
        let mut r = claimed(Class::Write);
        r.complete(&r.fence().unwrap(), completion(), Timestamp(2_000))
            .unwrap();
        assert_eq!(r.state, State::Completed);
        assert_eq!(r.expires_at, Some(Timestamp(2_000).plus(WINDOW)));
        assert_eq!(r.units, 7);
        assert_eq!(r.provider_request_id.as_deref(), Some("req_1"));
        assert!(r.is_replayable(Timestamp(2_001)));
        assert!(!r.is_replayable(Timestamp(2_000).plus(WINDOW)));
    }

    #[test]
    fn the_upstream_can_shorten_the_window() {
        let mut r = claimed(Class::Write);
        let mut c = completion();
        c.replay_until = Some(Timestamp(60_000));
        r.complete(&r.fence().unwrap(), c, Timestamp(2_000))
            .unwrap();
        assert_eq!(r.expires_at, Some(Timestamp(60_000)));
        // It can shorten, never lengthen.
        let mut r = claimed(Class::Write);
        let mut c = completion();
        c.replay_until = Some(Timestamp(i64::MAX));
        r.complete(&r.fence().unwrap(), c, Timestamp(2_000))
            .unwrap();
        assert_eq!(r.expires_at, Some(Timestamp(2_000).plus(WINDOW)));
    }

    #[test]
    fn a_stale_owner_is_refused_after_a_take_over() {
        let mut r = claimed(Class::Write);
        let stale = r.fence().unwrap();
        let lapsed = Timestamp(1_000).plus(LEASE);
        let TakeOverOutcome::Owned(_) = r.take_over(1, "b", LEASE, lapsed).unwrap() else {
            panic!("a write is executed again")
        };
        assert_eq!(r.attempt, 2);
        assert_eq!(r.owner.as_deref(), Some("b"));
        let err = r.complete(&stale, completion(), lapsed).unwrap_err();
        assert!(
            matches!(err, TransitionError::Fenced { attempt: 1, .. }),
            "{err:?}"
        );
        assert!(matches!(
            r.release(&stale, None, WINDOW, lapsed),
            Err(TransitionError::Fenced { .. })
        ));
        assert!(matches!(
            r.renew(&stale, LEASE, lapsed),
            Err(TransitionError::Fenced { .. })
        ));
        assert!(matches!(
            r.mark_unknown(&stale, "x".into(), lapsed),
            Err(TransitionError::Fenced { .. })
        ));
        // The new owner's write goes through.
        r.complete(&r.fence().unwrap(), completion(), lapsed)
            .unwrap();
        // And the stale owner is still fenced, not told the record is completed.
        assert!(matches!(
            r.complete(&stale, completion(), lapsed),
            Err(TransitionError::Fenced { .. })
        ));
    }

    #[test]
    fn a_wrong_attempt_number_is_refused() {
        let mut r = claimed(Class::Write);
        let mut wrong = r.fence().unwrap();
        wrong.attempt = 2;
        assert!(matches!(
            r.complete(&wrong, completion(), Timestamp(2_000)),
            Err(TransitionError::Fenced { attempt: 2, .. })
        ));
        let mut other_owner = r.fence().unwrap();
        other_owner.owner = "mallory".into();
        assert!(matches!(
            r.complete(&other_owner, completion(), Timestamp(2_000)),
            Err(TransitionError::Fenced { .. })
        ));
        assert_eq!(
            r.state,
            State::Processing,
            "a refused transition changes nothing"
        );
    }

    #[test]
    fn a_transition_retried_after_it_was_applied_changes_nothing_and_is_not_refused() {
        let mut r = claimed(Class::Write);
        let fence = r.fence().unwrap();
        r.complete(&fence, completion(), Timestamp(2_000)).unwrap();
        let written = r.clone();
        r.complete(&fence, completion(), Timestamp(3_000)).unwrap();
        assert_eq!(r, written, "the retry rewrote the record");
        // Not another owner's, nor another attempt's, nor into another state.
        let mut other = fence.clone();
        other.attempt += 1;
        assert!(matches!(
            r.complete(&other, completion(), Timestamp(3_000)),
            Err(TransitionError::Fenced { .. })
        ));
        assert!(matches!(
            r.release(&fence, None, WINDOW, Timestamp(3_000)),
            Err(TransitionError::WrongState {
                state: State::Completed,
                ..
            })
        ));
        let mut u = claimed(Class::Action);
        let f = u.fence().unwrap();
        u.mark_unknown(&f, "timeout".into(), Timestamp(2_000))
            .unwrap();
        u.mark_unknown(&f, "timeout".into(), Timestamp(3_000))
            .unwrap();
        assert_eq!(u.updated_at, Timestamp(2_000));
        let mut l = claimed(Class::Write);
        let f = l.fence().unwrap();
        l.release(&f, None, WINDOW, Timestamp(2_000)).unwrap();
        l.release(&f, None, WINDOW, Timestamp(3_000)).unwrap();
        assert_eq!(l.expires_at, Some(Timestamp(2_000).plus(WINDOW)));
    }

    #[test]
    fn completing_a_released_record_is_refused() {
        let mut r = claimed(Class::Write);
        let fence = r.fence().unwrap();
        r.release(&fence, None, WINDOW, Timestamp(2_000)).unwrap();
        let err = r
            .complete(&fence, completion(), Timestamp(2_001))
            .unwrap_err();
        assert!(
            matches!(
                err,
                TransitionError::WrongState {
                    state: State::Released,
                    action: "complete",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn take_over_needs_a_lapsed_lease_and_the_seen_attempt() {
        let mut r = claimed(Class::Write);
        assert!(matches!(
            r.take_over(1, "b", LEASE, Timestamp(2_000)),
            Err(TransitionError::LeaseHeld { .. })
        ));
        let lapsed = Timestamp(1_000).plus(LEASE);
        assert!(matches!(
            r.take_over(2, "b", LEASE, lapsed),
            Err(TransitionError::Fenced { .. })
        ));
        r.take_over(1, "b", LEASE, lapsed).unwrap();
        // A second taker that saw attempt 1 loses.
        assert!(matches!(
            r.take_over(1, "c", LEASE, lapsed.plus(LEASE)),
            Err(TransitionError::Fenced { .. })
        ));
        // Renewal keeps the lease alive.
        let f = r.fence().unwrap();
        r.renew(&f, LEASE, lapsed.plus(Duration::from_secs(20)))
            .unwrap();
        assert!(!r.lease_lapsed(lapsed.plus(LEASE)));
    }

    #[test]
    fn an_action_whose_owner_died_becomes_outcome_unknown() {
        let mut r = claimed(Class::Action);
        let lapsed = Timestamp(1_000).plus(LEASE);
        let TakeOverOutcome::OutcomeUnknown(after) = r.take_over(1, "b", LEASE, lapsed).unwrap()
        else {
            panic!("an action is never executed again")
        };
        assert_eq!(after.state, State::OutcomeUnknown);
        assert_eq!(after.attempt, 1);
        assert!(after.last_error.unwrap().contains("may have happened"));
    }

    #[test]
    fn resolve_only_out_of_outcome_unknown() {
        let mut r = claimed(Class::Action);
        let released = Resolution::Released {
            window: std::time::Duration::from_secs(3600),
            reason: "operator".into(),
        };
        assert!(matches!(
            r.resolve(released.clone(), Timestamp(2_000)),
            Err(TransitionError::WrongState {
                state: State::Processing,
                ..
            })
        ));
        r.mark_unknown(&r.fence().unwrap(), "timeout".into(), Timestamp(2_000))
            .unwrap();
        let mut completed = r.clone();
        r.resolve(released.clone(), Timestamp(3_000)).unwrap();
        assert_eq!(r.state, State::Released);
        // A released verdict expires with its window, like any released record.
        assert_eq!(r.expires_at, Some(Timestamp(3_000 + 3_600_000)));
        assert!(!r.is_expired(Timestamp(3_000 + 3_599_999)));
        assert!(r.is_expired(Timestamp(3_000 + 3_600_000)));
        assert!(matches!(
            r.resolve(released, Timestamp(3_000)),
            Err(TransitionError::WrongState {
                state: State::Released,
                ..
            })
        ));
        completed
            .resolve(
                Resolution::Completed {
                    response: StoredResponse {
                        status: 200,
                        headers: vec![],
                        body: Some(Bytes::from_static(b"ok")),
                    },
                    window: WINDOW,
                    reason: "reconciled".into(),
                },
                Timestamp(3_000),
            )
            .unwrap();
        assert_eq!(completed.state, State::Completed);
        assert!(completed.is_replayable(Timestamp(3_001)));
        let mut done = completed.clone();
        assert!(matches!(
            done.resolve(
                Resolution::Released {
                    window: std::time::Duration::from_secs(3600),
                    reason: "x".into()
                },
                Timestamp(4_000)
            ),
            Err(TransitionError::WrongState {
                state: State::Completed,
                ..
            })
        ));
    }

    #[test]
    fn state_names_round_trip() {
        for s in [
            State::Processing,
            State::Completed,
            State::Released,
            State::OutcomeUnknown,
        ] {
            assert_eq!(s.as_str().parse::<State>().unwrap(), s);
        }
        assert!("done".parse::<State>().is_err());
    }
}
