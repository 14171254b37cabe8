//! Submission: [`Guard::submit_job`] claims a job's record and queues its call in one
//! transaction, then the first request waits up to the route's `wait` for its answer
//! (the head this instance's worker hands it, or the record's completion by any
//! instance) and gets it, or 202 while the job still runs. A duplicate gets the same job
//! (joined, accepted, or replayed once done); the retry of a failed job is queued again.

use std::sync::Arc;

use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode};
use oncely_core::{ClaimSpec, Claimant, Record, Refusal, State, Step};
use oncely_engine::{retry_after, Claimed, Claimer, Claiming, Verdict};
use oncely_store::StoreError;

use super::request::JobRequest;
use crate::body::full;
use crate::guard::{Execution, FreshResponse, Guard, GuardedCall, UpstreamFailure};
use crate::job_board::{Head, JobBoard};
use crate::policy::RoutePolicy;

impl Guard {
    /// The jobs' shared board.
    pub fn jobs(&self) -> &JobBoard {
        &self.jobs
    }

    /// Claims a job's record and queues its call in one transaction, then waits up to
    /// `call.wait` for its answer: [`Execution::Fresh`] if it came, else
    /// [`Execution::Accepted`]. A duplicate gets the same job (joined, accepted, or
    /// replayed once done); the retry of a failed job is queued again (see the
    /// [`jobs`](crate::jobs) module).
    pub async fn submit_job(
        &self,
        policy: &Arc<RoutePolicy>,
        call: GuardedCall,
        job: JobRequest,
    ) -> Execution {
        self.jobs.register_route(policy.clone());
        // A duplicate waits once for the job, at most `wait`; the claim table says what
        // it gets, the claim loop carries it out.
        let claiming = Claiming {
            claimant: Claimant::JobRequest,
            fingerprint: Some(call.fingerprint),
            deadline: tokio::time::Instant::now() + call.wait,
            now: None,
        };
        let mut claimer = Submission {
            guard: self,
            policy,
            spec: self.engine().claim_spec(&call),
            job: &job,
        };
        match self.engine().claim(&mut claimer, claiming).await {
            // The store reclaims a released record with this fingerprint (and queues it
            // again); seeing one here means it was released between the store's
            // decision and now, or while we waited, so report the failure.
            Verdict::Decided {
                step: Step::Refuse(Refusal::Failed),
                record,
                ..
            } => Execution::UpstreamFailed {
                failure: UpstreamFailure::Lost(failure_text(&record)),
                record,
            },
            Verdict::Decided {
                step: Step::Refuse(Refusal::StillRunning),
                record,
                ..
            } => Execution::Accepted {
                record,
                first: false,
                retry_after: retry_after(call.wait),
            },
            Verdict::Owned(record) => self.await_job(record, &call).await,
            verdict => self.engine().answer(verdict, call.wait),
        }
    }

    /// The first request of a job waits for its answer: the head from this instance's
    /// worker, or the record's completion by any instance.
    async fn await_job(&self, record: Record, call: &GuardedCall) -> Execution {
        let mut head = self.jobs.wait_head(&record.id);
        self.jobs.wake();
        let outcome = tokio::select! {
            // The head first: when both are ready (a busy machine polls this task late),
            // the record alone no longer has the upstream's answer to a failed run.
            biased;
            h = &mut head => match h {
                Ok(h) => from_head(record.clone(), h),
                // The worker ran it without us (it leased the task before we waited):
                // the record tells.
                Err(_) => self.after_wait(record.clone(), call).await,
            },
            r = self.store().wait_for(&record.id, call.wait) => match r {
                Ok(r) if r.state == State::Processing => Execution::Accepted {
                    record: r,
                    first: true,
                    retry_after: retry_after(call.wait),
                },
                // This instance's worker took the head: it is on its way (or the run
                // ended without one), and it says more than the ended record.
                Ok(r) if self.jobs.head_taken(&record.id) => match head.await {
                    Ok(h) => from_head(record.clone(), h),
                    Err(_) => first_answer(r),
                },
                Ok(r) => first_answer(r),
                Err(e) => Execution::StoreUnavailable(e.to_string()),
            },
        };
        self.jobs.forget(&record.id);
        outcome
    }

    async fn after_wait(&self, record: Record, call: &GuardedCall) -> Execution {
        match self.store().wait_for(&record.id, call.wait).await {
            Ok(r) if r.state == State::Processing => Execution::Accepted {
                record: r,
                first: true,
                retry_after: retry_after(call.wait),
            },
            Ok(r) => first_answer(r),
            Err(e) => Execution::StoreUnavailable(e.to_string()),
        }
    }
}

/// A job's submission claims its record and queues its call in one transaction
/// ([`TaskQueue::claim_with_task`](oncely_store::TaskQueue::claim_with_task)); it never
/// takes a record over (the worker does).
struct Submission<'a> {
    guard: &'a Guard,
    policy: &'a Arc<RoutePolicy>,
    spec: ClaimSpec,
    job: &'a JobRequest,
}

impl Claimer for Submission<'_> {
    type Owned = Record;

    fn claim(&mut self) -> BoxFuture<'_, Result<Claimed<Record>, StoreError>> {
        let task = self.job.task(self.policy, self.guard.job_key.as_ref());
        Box::pin(async move {
            self.guard
                .store()
                .claim_with_task(std::slice::from_ref(&self.spec), None, task)
                .await
                .map(Claimed::from)
        })
    }

    fn take_over<'a>(
        &'a mut self,
        found: &'a Record,
    ) -> BoxFuture<'a, Result<Claimed<Record>, StoreError>> {
        unreachable!("a job's request never takes {} over", found.id)
    }
}

fn failure_text(record: &Record) -> String {
    record
        .last_error
        .clone()
        .unwrap_or_else(|| "the job failed".into())
}

/// The first request's answer from what this instance's worker sent.
fn from_head(record: Record, head: Head) -> Execution {
    head.into_execution(record).map_fresh(crate::guard::fresh)
}

/// The first request's answer from its ended record (the job ran on another instance).
fn first_answer(record: Record) -> Execution {
    match record.state {
        State::Completed => match record.response.clone() {
            Some(response) if response.body.is_some() => {
                let mut headers = HeaderMap::new();
                crate::headers::replay_headers(&response.headers, &mut headers);
                Execution::Fresh(FreshResponse {
                    status: StatusCode::from_u16(response.status).unwrap_or(StatusCode::OK),
                    headers,
                    body: full(response.body.unwrap_or_default()),
                    record,
                })
            }
            _ => Execution::TooLarge(record),
        },
        State::OutcomeUnknown => Execution::OutcomeUnknown(record),
        State::Released | State::Processing => Execution::UpstreamFailed {
            failure: UpstreamFailure::Lost(failure_text(&record)),
            record,
        },
    }
}
