//! What a claimant does with the record it found: the claim path as one table.
//!
//! A claimant is a request on an HTTP route or an MCP tool call ([`Claimant::Call`]), a
//! job's request ([`Claimant::JobRequest`]), the job worker that leased the record's
//! task ([`Claimant::JobWorker`]) or the gateway's sweep for actions whose owner went
//! away ([`Claimant::Sweep`]). When the ledger answers its claim with an existing
//! record (or a wait or a take-over hands it a record), [`decide`] says the one [`Step`]
//! it takes. The rows, first match wins:
//!
//! | found record                        | claimant                    | step                                  |
//! |-------------------------------------|-----------------------------|---------------------------------------|
//! | other fingerprint                   | any                         | `Refuse(KeyReused)`                   |
//! | not processing                      | job worker, sweep           | `Refuse(Ended)` (drop the task)       |
//! | processing, clock not read          | sweep                       | `ReadClock` (read it, decide again)   |
//! | processing, lapsed a lease ago      | sweep                       | `TakeOver`                            |
//! | processing                          | sweep                       | `Refuse(StillRunning)` (left alone)   |
//! | completed, body kept, not waited    | call, job request           | `Replay`                              |
//! | completed, body kept, waited        | call, job request           | `Join`                                |
//! | completed, body not kept            | call, job request           | `Refuse(TooLarge)`                    |
//! | outcome_unknown                     | call, job request           | `Refuse(OutcomeUnknown)`              |
//! | released                            | call                        | `ClaimAgain`                          |
//! | released                            | job request                 | `Refuse(Failed)`                      |
//! | processing                          | job request, not waited     | `WaitUntil(None)` (the whole wait)    |
//! | processing                          | job request, waited         | `Refuse(StillRunning)` (accepted)     |
//! | processing                          | job worker, first run       | `Own` (run under the request's claim) |
//! | processing, clock not read          | call, job worker            | `ReadClock` (read it, decide again)   |
//! | processing, lease lapsed            | call, job worker            | `TakeOver`                            |
//! | processing, lease live, wait over   | call                        | `Refuse(StillRunning)` (in flight)    |
//! | processing, lease live              | call, job worker            | `WaitUntil(lease_until)`              |
//!
//! `TakeOver` asks the store to move the record to a new attempt; the store decides by
//! class (a write or a job runs again, an action becomes `outcome_unknown`) and refuses
//! if someone else moved it first, see [`Record::take_over`]. A job worker that is told to
//! wait retries its task when the lease ends. The clock is read only for a processing
//! record (it costs a round trip on PostgreSQL), hence `ReadClock`.
//!
//! The sweep is slower than a duplicate to call an owner gone: it takes a record over
//! only once its lease has been past for a whole lease more, at least [`SWEEP_GRACE`]
//! ([`Record::lease_lapsed_long_ago`]), so that an owner whose renewals a store outage
//! held up renews first.
//!
//! `oncely_core::decide` is the only place that decides what a claimant does with an
//! existing record; the engine's claim loop (`oncely_engine::claim`) only performs the
//! step, for every claimant.

use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::record::{Record, State};
use crate::units::Timestamp;

/// Who found the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimant {
    /// A request on an HTTP route or an MCP tool call.
    Call,
    /// A job's request: it waits once for the job, never takes it over (the worker does)
    /// and reports a released job as failed.
    JobRequest,
    /// The job worker that leased the record's task; `first_run` on the task's first
    /// attempt, which runs under the claim the request made.
    JobWorker {
        /// The task's first attempt.
        first_run: bool,
    },
    /// The gateway's sweep, which marks an action whose owner went away `outcome_unknown`
    /// whether or not a duplicate ever comes.
    Sweep,
}

impl Claimant {
    /// Whether this claimant waits on a record whose lease is live (within its `wait`):
    /// a call and a job's request do; the job worker (it retries its task later) and the
    /// sweep (it looks again at its next round) do not.
    pub fn waits(self) -> bool {
        matches!(self, Claimant::Call | Claimant::JobRequest)
    }
}

/// How far past its lapse the sweep leaves an owner's lease at the least before it takes
/// the record over (it also waits a whole lease more): a live owner renews every third of
/// its lease, so this is far beyond a renewal that is merely late, or one held up by a
/// store that was briefly away.
pub const SWEEP_GRACE: Duration = Duration::from_secs(2);

/// What the claimant brings to the record it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The request's fingerprint (a job worker passes the record's own).
    pub fingerprint: Fingerprint,
    /// Who is looking.
    pub claimant: Claimant,
    /// Whether the claimant has already waited on this record (a completed record is then
    /// joined, not replayed).
    pub waited: bool,
    /// What is left of the claimant's `wait` (used by calls).
    pub wait_left: Duration,
}

/// Why a claimant stops without executing or answering from a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The same key was used with a different fingerprint.
    KeyReused,
    /// Completed, but its body was larger than `max_response` and was not kept.
    TooLarge,
    /// Nobody knows whether the action happened.
    OutcomeUnknown,
    /// The job was released: its run failed.
    Failed,
    /// Still processing and the claimant waits no longer (in flight / accepted).
    StillRunning,
    /// The record is no longer processing: a job worker's task, or the sweep, has nothing
    /// left to do with it.
    Ended,
}

/// The one step a claimant takes with the record it found. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Execute under the claim the record already holds.
    Own,
    /// Answer with the stored response (a repeat that did not wait).
    Replay,
    /// Answer with the stored response (a repeat that waited for it).
    Join,
    /// Wait for the record to change, at most until this time (the owner's lease; `None`:
    /// the claimant's whole wait).
    WaitUntil(Option<Timestamp>),
    /// The owner's lease lapsed: take the record over.
    TakeOver,
    /// The record was released: claim it again (and execute if the claim is won).
    ClaimAgain,
    /// Read the ledger's clock and decide again with it.
    ReadClock,
    /// Stop, for this reason.
    Refuse(Refusal),
}

/// What `seen`'s claimant does with `found` at `now` (`None`: the clock was not read).
pub fn decide(found: &Record, seen: &Seen, now: Option<Timestamp>) -> Step {
    use Claimant::*;
    if found.fingerprint != seen.fingerprint {
        return Step::Refuse(Refusal::KeyReused);
    }
    if let JobWorker { .. } | Sweep = seen.claimant {
        if found.state != State::Processing {
            return Step::Refuse(Refusal::Ended);
        }
    }
    match seen.claimant {
        JobWorker { first_run: true } => return Step::Own,
        Sweep => {
            return match now {
                None => Step::ReadClock,
                Some(now) if found.lease_lapsed_long_ago(now, SWEEP_GRACE) => Step::TakeOver,
                Some(_) => Step::Refuse(Refusal::StillRunning),
            }
        }
        _ => {}
    }
    match found.state {
        State::Completed => {
            let kept = found.response.as_ref().is_some_and(|r| r.body.is_some());
            match (kept, seen.waited) {
                (false, _) => Step::Refuse(Refusal::TooLarge),
                (true, false) => Step::Replay,
                (true, true) => Step::Join,
            }
        }
        State::OutcomeUnknown => Step::Refuse(Refusal::OutcomeUnknown),
        State::Released => match seen.claimant {
            JobRequest => Step::Refuse(Refusal::Failed),
            _ => Step::ClaimAgain,
        },
        State::Processing => {
            if seen.claimant == JobRequest {
                return if seen.waited {
                    Step::Refuse(Refusal::StillRunning)
                } else {
                    Step::WaitUntil(None)
                };
            }
            let Some(now) = now else {
                return Step::ReadClock;
            };
            if found.lease_lapsed(now) {
                Step::TakeOver
            } else if seen.claimant == Call && seen.wait_left.is_zero() {
                Step::Refuse(Refusal::StillRunning)
            } else {
                Step::WaitUntil(found.lease_until)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use crate::policy::Class;
    use crate::record::{ClaimSpec, RecordId, StoredResponse};

    const LEASE: Duration = Duration::from_secs(30);
    const WAIT: Duration = Duration::from_secs(10);
    const FP: Fingerprint = Fingerprint([1; 32]);
    const T0: Timestamp = Timestamp(1_000);

    fn found(state: State) -> Record {
        let spec = ClaimSpec {
            identity: Identity::new(
                "p".into(),
                "POST /x".into(),
                Class::Write,
                Some("k".into()),
                FP,
                None,
            ),
            owner: "a".into(),
            lease: LEASE,
        };
        let mut r = Record::new_claim(RecordId("r1".into()), &spec, T0);
        r.state = state;
        if state == State::Completed {
            r.response = Some(StoredResponse {
                status: 200,
                headers: vec![],
                body: Some(bytes::Bytes::from_static(b"{}")),
            });
        }
        r
    }

    fn seen(claimant: Claimant) -> Seen {
        Seen {
            fingerprint: FP,
            claimant,
            waited: false,
            wait_left: WAIT,
        }
    }

    fn waited(claimant: Claimant) -> Seen {
        Seen {
            waited: true,
            ..seen(claimant)
        }
    }

    const CALL: Claimant = Claimant::Call;
    const JOB: Claimant = Claimant::JobRequest;
    const FIRST: Claimant = Claimant::JobWorker { first_run: true };
    const LATER: Claimant = Claimant::JobWorker { first_run: false };

    fn live() -> Option<Timestamp> {
        Some(T0.plus(Duration::from_secs(1)))
    }

    fn lapsed() -> Option<Timestamp> {
        Some(T0.plus(LEASE))
    }

    #[test]
    fn another_fingerprint_is_key_reused_for_every_claimant() {
        for c in [CALL, JOB, FIRST, LATER] {
            let other = Seen {
                fingerprint: Fingerprint([2; 32]),
                ..seen(c)
            };
            for s in [State::Processing, State::Completed, State::Released] {
                assert_eq!(
                    decide(&found(s), &other, live()),
                    Step::Refuse(Refusal::KeyReused)
                );
            }
        }
    }

    #[test]
    fn a_job_worker_drops_a_task_whose_record_ended() {
        for c in [FIRST, LATER] {
            for s in [State::Completed, State::Released, State::OutcomeUnknown] {
                assert_eq!(
                    decide(&found(s), &seen(c), live()),
                    Step::Refuse(Refusal::Ended)
                );
            }
        }
    }

    #[test]
    fn completed_and_not_waited_is_replayed() {
        for c in [CALL, JOB] {
            assert_eq!(
                decide(&found(State::Completed), &seen(c), None),
                Step::Replay
            );
        }
    }

    #[test]
    fn completed_after_a_wait_is_joined() {
        for c in [CALL, JOB] {
            assert_eq!(
                decide(&found(State::Completed), &waited(c), None),
                Step::Join
            );
        }
    }

    #[test]
    fn completed_without_its_body_is_too_large() {
        let mut r = found(State::Completed);
        r.response.as_mut().unwrap().body = None;
        for s in [seen(CALL), waited(CALL), seen(JOB), waited(JOB)] {
            assert_eq!(decide(&r, &s, None), Step::Refuse(Refusal::TooLarge));
        }
        r.response = None;
        assert_eq!(
            decide(&r, &seen(CALL), None),
            Step::Refuse(Refusal::TooLarge)
        );
    }

    #[test]
    fn outcome_unknown_is_refused() {
        for s in [seen(CALL), waited(CALL), seen(JOB), waited(JOB)] {
            assert_eq!(
                decide(&found(State::OutcomeUnknown), &s, None),
                Step::Refuse(Refusal::OutcomeUnknown)
            );
        }
    }

    #[test]
    fn a_call_claims_a_released_record_again() {
        for s in [seen(CALL), waited(CALL)] {
            assert_eq!(decide(&found(State::Released), &s, None), Step::ClaimAgain);
        }
    }

    #[test]
    fn a_job_request_reports_a_released_job_failed() {
        for s in [seen(JOB), waited(JOB)] {
            assert_eq!(
                decide(&found(State::Released), &s, None),
                Step::Refuse(Refusal::Failed)
            );
        }
    }

    #[test]
    fn a_job_request_waits_once_for_a_running_job_whatever_its_lease() {
        let r = found(State::Processing);
        for now in [None, live(), lapsed()] {
            assert_eq!(decide(&r, &seen(JOB), now), Step::WaitUntil(None));
        }
    }

    #[test]
    fn a_job_request_that_waited_is_accepted() {
        let r = found(State::Processing);
        for now in [None, live(), lapsed()] {
            assert_eq!(
                decide(&r, &waited(JOB), now),
                Step::Refuse(Refusal::StillRunning)
            );
        }
    }

    #[test]
    fn a_jobs_first_run_owns_the_requests_claim() {
        for now in [None, live(), lapsed()] {
            assert_eq!(
                decide(&found(State::Processing), &seen(FIRST), now),
                Step::Own
            );
        }
    }

    #[test]
    fn a_processing_record_needs_the_clock() {
        for c in [CALL, LATER] {
            assert_eq!(
                decide(&found(State::Processing), &seen(c), None),
                Step::ReadClock
            );
        }
    }

    #[test]
    fn a_lapsed_lease_is_taken_over_even_when_the_wait_is_over() {
        for c in [CALL, LATER] {
            let over = Seen {
                wait_left: Duration::ZERO,
                ..seen(c)
            };
            for s in [seen(c), waited(c), over] {
                assert_eq!(
                    decide(&found(State::Processing), &s, lapsed()),
                    Step::TakeOver
                );
            }
        }
        let mut no_lease = found(State::Processing);
        no_lease.lease_until = None;
        assert_eq!(decide(&no_lease, &seen(CALL), live()), Step::TakeOver);
    }

    #[test]
    fn a_call_whose_wait_is_over_is_in_flight() {
        let over = Seen {
            wait_left: Duration::ZERO,
            ..waited(CALL)
        };
        assert_eq!(
            decide(&found(State::Processing), &over, live()),
            Step::Refuse(Refusal::StillRunning)
        );
    }

    #[test]
    fn a_live_lease_is_waited_on_until_it_ends() {
        let r = found(State::Processing);
        let until = r.lease_until;
        assert!(until.is_some());
        for s in [seen(CALL), waited(CALL), seen(LATER)] {
            assert_eq!(decide(&r, &s, live()), Step::WaitUntil(until));
        }
        // A job worker waits (retries) even with no time left on a call's wait.
        let over = Seen {
            wait_left: Duration::ZERO,
            ..seen(LATER)
        };
        assert_eq!(decide(&r, &over, live()), Step::WaitUntil(until));
    }

    const SWEEP: Claimant = Claimant::Sweep;

    #[test]
    fn the_sweep_leaves_a_record_that_ended() {
        for s in [State::Completed, State::Released, State::OutcomeUnknown] {
            assert_eq!(
                decide(&found(s), &seen(SWEEP), lapsed()),
                Step::Refuse(Refusal::Ended)
            );
        }
    }

    #[test]
    fn the_sweep_takes_over_only_a_lease_past_by_a_whole_lease_more() {
        let r = found(State::Processing);
        assert_eq!(decide(&r, &seen(SWEEP), None), Step::ReadClock);
        // Lapsed, but not by a whole lease more: a duplicate would take it, the sweep not.
        for now in [
            live(),
            lapsed(),
            Some(T0.plus(LEASE * 2 - Duration::from_millis(1))),
        ] {
            assert_eq!(
                decide(&r, &seen(SWEEP), now),
                Step::Refuse(Refusal::StillRunning)
            );
        }
        assert_eq!(
            decide(&r, &seen(SWEEP), Some(T0.plus(LEASE * 2))),
            Step::TakeOver
        );
        // A short lease is left for SWEEP_GRACE past its lapse at the least.
        let mut short = r.clone();
        short.lease_until = Some(T0.plus(Duration::from_millis(500)));
        let lapse = T0.plus(Duration::from_millis(500));
        assert_eq!(
            decide(
                &short,
                &seen(SWEEP),
                Some(lapse.plus(Duration::from_millis(1999)))
            ),
            Step::Refuse(Refusal::StillRunning)
        );
        assert_eq!(
            decide(&short, &seen(SWEEP), Some(lapse.plus(SWEEP_GRACE))),
            Step::TakeOver
        );
        // A record without a lease is never swept.
        let mut none = r;
        none.lease_until = None;
        assert_eq!(
            decide(&none, &seen(SWEEP), Some(T0.plus(LEASE * 10))),
            Step::Refuse(Refusal::StillRunning)
        );
    }

    #[test]
    fn only_calls_and_job_requests_wait() {
        assert!(CALL.waits() && JOB.waits());
        assert!(!FIRST.waits() && !LATER.waits() && !SWEEP.waits());
    }
}
