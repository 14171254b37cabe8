//! Jobs: slow work the gateway owns, queued durably in the ledger's database.
//!
//! A `job` route's request is claimed **and** queued in one transaction
//! ([`Store::claim_with_task`](oncely_store::TaskQueue::claim_with_task)): the ledger record
//! (whose id is the job id) and a task of kind `job:ROUTE` holding what the upstream call
//! needs (method, path and query, the headers worth forwarding, the body; all but the
//! method and path sealed with the guard's [`JobKey`](crate::JobKey) when it has one). A
//! [`JobWorker`] per gateway instance leases due tasks, at most `concurrency` running per
//! route on all instances together
//! ([`Store::lease_tasks_capped`](oncely_store::TaskQueue::lease_tasks_capped)), and runs
//! each through the same owner
//! machinery as any guarded call (downstream key, lease renewal, recording). Then the
//! task is finished and deleted with its body.
//!
//! ```text
//!  request ──claim_with_task──► record processing + task pending ──lease──► worker runs it
//!     │ waits up to `wait`                                                   │
//!     ├── the head arrives (same instance) ──► the answer, streamed (fresh)   ├─► record completed/released
//!     ├── the record completes (any instance) ──► the stored answer (fresh)   └─► task finished (body gone)
//!     └── still running ──► 202, Location: /_oncely/jobs/ID
//! ```
//!
//! - A duplicate gets the same job: it waits up to `wait` too, then gets the answer
//!   (`joined`) or 202 with the same id. Once done, duplicates are `replayed`.
//! - The gateway may stop at any point: a pending task runs after a restart (or on
//!   another instance), exactly once per record; the worker renews the task's lease
//!   (the route's `lease`) while the job runs, so a task whose worker died mid-call holds
//!   its slot no longer than one `lease`: it is leased again, and the record (whose lease
//!   lapses at the same time) is taken over with attempt + 1 and the same downstream key
//!   (jobs are write-like).
//! - A failed job (its record released) runs again when the original request is sent
//!   again: that retry's `claim_with_task` reclaims the released record (same id,
//!   attempt + 1, so the same downstream key) and queues the call again, so the retry
//!   waits for a free slot and survives a restart like any job.
//! - Each run the worker ends writes one log line (target `oncely::request`, message
//!   "job finished") with the fields of a request's line, and counts it in
//!   `oncely_requests_total`; its `status` is the job's status as
//!   `GET /_oncely/jobs/ID` shows it (`completed`, `failed`, `outcome_unknown`), not an
//!   `Oncely-Status` value, so that a job's requests (`fresh` for the first, whether it
//!   got the answer or 202, `joined`/`replayed` for duplicates) and its execution are
//!   counted apart. `duration_ms` is the run's, from the upstream call's start to its
//!   outcome recorded.
//! - `GET /_oncely/jobs/ID` and `/result` answer only the principal that started the
//!   job; anyone else gets 404, so an id reveals nothing.
//!
//! # Layout
//!
//! The files depend on each other in one direction: `submit` and `worker` use
//! `request`, `worker` also `status` (a job's status for its log line); `request` and
//! `status` use neither.
//!
//! - `request`: the [`JobRequest`], the task that keeps it until it runs (its headers,
//!   body and query sealed with the job key), and the request a run sends again;
//!   [`task_kind`].
//! - `submit`: [`Guard::submit_job`](crate::Guard::submit_job): the claim and the queued
//!   task in one transaction, the first request's wait for its answer, a duplicate's
//!   answer.
//! - `worker`: the [`JobWorker`], which leases due tasks and runs each through the
//!   engine's owner; [`task_lease`].
//! - `status`: `/_oncely/jobs/ID` and `/result` ([`status_endpoint`]), the JSON of a job
//!   ([`job_json`], [`job_status`]) and the 202 of one still running.

mod request;
mod status;
mod submit;
#[cfg(test)]
mod tests;
mod worker;

pub use request::{task_kind, JobRequest};
pub(crate) use status::accepted_response;
pub use status::{job_json, job_status, status_endpoint, JOBS_PATH};
pub use worker::{task_lease, JobWorker, JobWorkerOptions};
