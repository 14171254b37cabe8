//! Jobs: slow work the gateway owns, queued durably in the ledger's database.
//!
//! A `job` route's request is claimed **and** queued in one transaction
//! ([`Store::claim_with_task`](oncely_store::TaskQueue::claim_with_task)): the ledger record
//! (whose id is the job id) and a task of kind `job:ROUTE` holding what the upstream call
//! needs (method, path and query, the headers worth forwarding, the body; all but the
//! method and path sealed with the guard's [`JobKey`] when it has one). A
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use oncely_core::{decide, Claimant, Refusal, Seen, Step as Decided};
use oncely_core::{DownstreamKey, Record, RecordId, State, TakeOverOutcome};
use oncely_engine::retry_after;
use oncely_store::queue::while_leased;
use oncely_store::{Claim, NewTask, Task, TaskOutcome};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tower::Service;

use crate::body::full;
use crate::guard::{Execution, FreshResponse, Guard, GuardedCall, UpstreamFailure};
use crate::job_board::{Head, JobBoard};
use crate::log::{log_job, provider_request_id, RequestLog};
use crate::policy::RoutePolicy;
use crate::problem::{Problem, ProblemCode, IDEMPOTENT_REPLAYED, ONCELY_RECORD, ONCELY_STATUS};
use crate::seal::{self, JobKey};
use crate::sources::RequestHead;
use crate::{BoxBody, BoxError};

/// Where job status lives on the gateway's own listener.
pub const JOBS_PATH: &str = "/_oncely/jobs/";

/// A job task's attempts before it is dead: effectively unlimited (each attempt is a
/// worker that died mid-call).
const JOB_MAX_ATTEMPTS: u32 = 1_000;

/// The queue kind of a route's jobs.
pub fn task_kind(route: &str) -> String {
    format!("job:{route}")
}

/// How long a worker's lease on a job task lasts without renewal: the route's `lease`,
/// like its record's. The worker renews both while the job runs, so the slot, the task
/// and the record of a worker that died are taken up again about one `lease` later.
pub fn task_lease(policy: &RoutePolicy) -> Duration {
    policy.lease
}

/// A job request: the call, and what the worker needs to make it again later.
#[derive(Debug, Clone)]
pub struct JobRequest {
    /// Method.
    pub method: Method,
    /// Path and query, as sent.
    pub target: String,
    /// The headers to forward (hop-by-hop, length and key headers are dropped here).
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

/// What a sealed job payload is bound to: its task's kind, method and path.
fn sealed_binding(kind: &str, method: &str, path: &str) -> Vec<u8> {
    format!("{kind} {method} {path}").into_bytes()
}

/// Headers a queued job does not keep: hop-by-hop headers (the one policy of
/// [`crate::headers`]), and those of one message's framing or set again when it runs.
fn keep_for_job(name: &HeaderName) -> bool {
    !crate::headers::is_hop_by_hop(name.as_str())
        && !matches!(
            name.as_str(),
            "content-length" | "host" | "idempotency-key" | "expect"
        )
}

impl JobRequest {
    /// The task that keeps this request until it runs. With a [`JobKey`] the headers,
    /// body and query are sealed into the task's body (see [`crate::seal`]); the store
    /// keeps only the method, the path and an opaque body.
    fn task(&self, policy: &RoutePolicy, key: Option<&JobKey>) -> NewTask {
        let headers: Vec<(String, String)> = self
            .headers
            .iter()
            .filter(|(n, _)| keep_for_job(n))
            .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        let kind = task_kind(&policy.name);
        let method = self.method.as_str().to_string();
        let (target, headers, body) = match key {
            Some(key) => {
                let path = self
                    .target
                    .split_once('?')
                    .map_or(self.target.as_str(), |(path, _)| path)
                    .to_string();
                let opened = seal::Opened {
                    target: self.target.clone(),
                    headers,
                    body: self.body.to_vec(),
                };
                let sealed = key.seal(&sealed_binding(&kind, &method, &path), &opened);
                (path, Vec::new(), sealed)
            }
            None => (self.target.clone(), headers, self.body.to_vec()),
        };
        NewTask {
            kind,
            target,
            method,
            headers,
            body,
            max_attempts: JOB_MAX_ATTEMPTS,
            timeout: policy.timeout,
            backoff: policy.lease,
        }
    }

    fn from_task(task: &Task, key: Option<&JobKey>) -> Result<JobRequest, String> {
        let method = Method::from_bytes(task.method.as_bytes())
            .map_err(|e| format!("queued job has a bad method: {e}"))?;
        let opened = if seal::is_sealed(&task.body) {
            let key = key.ok_or("the queued job is sealed and no job key is set")?;
            key.open(
                &sealed_binding(&task.kind, &task.method, &task.target),
                &task.body,
            )?
        } else {
            // Queued before sealing was on (or by a guard without a key).
            seal::Opened {
                target: task.target.clone(),
                headers: task.headers.clone(),
                body: task.body.clone(),
            }
        };
        let mut headers = HeaderMap::new();
        for (n, v) in &opened.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(n.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                headers.append(n, v);
            }
        }
        Ok(JobRequest {
            method,
            target: opened.target,
            headers,
            body: Bytes::from(opened.body),
        })
    }

    /// The request the upstream gets, with the downstream key.
    fn upstream_request(&self, key: &DownstreamKey) -> Request<BoxBody> {
        let mut req = Request::new(full(self.body.clone()));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.target.parse().unwrap_or_else(|_| "/".parse().unwrap());
        *req.headers_mut() = self.headers.clone();
        let h = req.headers_mut();
        crate::headers::sent_whole(h, self.body.len());
        h.insert(
            HeaderName::from_static("idempotency-key"),
            HeaderValue::from_str(key.as_str()).expect("a downstream key is visible ASCII"),
        );
        req
    }
}

impl Guard {
    /// The jobs' shared board.
    pub fn jobs(&self) -> &JobBoard {
        &self.jobs
    }

    /// Claims a job's record and queues its call in one transaction, then waits up to
    /// `call.wait` for its answer: [`Execution::Fresh`] if it came, else
    /// [`Execution::Accepted`]. A duplicate gets the same job (joined, accepted, or
    /// replayed once done); the retry of a failed job is queued again (see the module
    /// docs).
    pub async fn submit_job(
        &self,
        policy: &Arc<RoutePolicy>,
        call: GuardedCall,
        job: JobRequest,
    ) -> Execution {
        self.jobs.register_route(policy.clone());
        let spec = self.engine().claim_spec(&call);
        let record = match self
            .store()
            .claim_with_task(
                std::slice::from_ref(&spec),
                None,
                job.task(policy, self.job_key.as_ref()),
            )
            .await
        {
            Ok(Claim::Owned(record)) => return self.await_job(record, &call).await,
            Ok(Claim::Existing(record)) => record,
            Err(e) => return Execution::StoreUnavailable(e.to_string()),
        };
        // A duplicate: the claim table says what it gets (it waits once, at most `wait`).
        let (mut record, mut waited) = (record, false);
        loop {
            let seen = Seen {
                fingerprint: call.fingerprint,
                claimant: Claimant::JobRequest,
                waited,
                wait_left: call.wait,
            };
            return match decide(&record, &seen, None) {
                Decided::Refuse(Refusal::KeyReused) => Execution::KeyReused(record),
                step @ (Decided::Replay | Decided::Join | Decided::Refuse(Refusal::TooLarge)) => {
                    self.engine().answer_completed(record, waited, step)
                }
                Decided::Refuse(Refusal::OutcomeUnknown) => Execution::OutcomeUnknown(record),
                // The store reclaims a released record with this fingerprint (and queues
                // it again); seeing one here means it was released between the store's
                // decision and now, or while we waited, so report the failure.
                Decided::Refuse(Refusal::Failed) => Execution::UpstreamFailed {
                    failure: UpstreamFailure::Lost(failure_text(&record)),
                    record,
                },
                Decided::Refuse(Refusal::StillRunning) => Execution::Accepted {
                    record,
                    first: false,
                    retry_after: retry_after(call.wait),
                },
                Decided::WaitUntil(_) => {
                    record = match self.store().wait_for(&record.id, call.wait).await {
                        Ok(r) => r,
                        Err(e) => return Execution::StoreUnavailable(e.to_string()),
                    };
                    waited = true;
                    continue;
                }
                step => unreachable!("a job's request is never told {step:?}"),
            };
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

/// The status of a job as `GET /_oncely/jobs/ID` shows it.
pub fn job_status(record: &Record) -> &'static str {
    match record.state {
        State::Processing => "running",
        State::Completed => "completed",
        State::Released => "failed",
        State::OutcomeUnknown => "outcome_unknown",
    }
}

/// The JSON of a job: `job_id`, `status`, `status_url`, `started_at`, and what is known.
pub fn job_json(record: &Record) -> serde_json::Value {
    let id = record.id.as_str();
    let mut v = serde_json::json!({
        "job_id": id,
        "status": job_status(record),
        "status_url": format!("{JOBS_PATH}{id}"),
        "result_url": format!("{JOBS_PATH}{id}/result"),
        "started_at": record.created_at.to_rfc3339(),
        "updated_at": record.updated_at.to_rfc3339(),
        "attempt": record.attempt,
    });
    if let Some(at) = record.completed_at {
        v["completed_at"] = at.to_rfc3339().into();
    }
    if let Some(r) = &record.response {
        v["upstream_status"] = r.status.into();
    }
    if record.state != State::Completed {
        if let Some(e) = &record.last_error {
            v["error"] = e.clone().into();
        }
    }
    v
}

fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<BoxBody> {
    let mut res = Response::new(full(v.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// The 202 answer of a job still running.
pub(crate) fn accepted_response(record: &Record, retry_after: Duration) -> Response<BoxBody> {
    let v = job_json(record);
    let mut res = json_response(StatusCode::ACCEPTED, &v);
    let location = format!("{JOBS_PATH}{}", record.id);
    let h = res.headers_mut();
    if let Ok(l) = HeaderValue::from_str(&location) {
        h.insert(http::header::LOCATION, l);
    }
    h.insert(
        http::header::RETRY_AFTER,
        HeaderValue::from(retry_after.as_secs().max(1)),
    );
    res
}

/// Answers `GET /_oncely/jobs/ID` and `GET /_oncely/jobs/ID/result`, for the principal
/// that started the job only (anyone else, and any unknown id, gets 404).
pub async fn status_endpoint(guard: &Guard, req: &Request<()>) -> Response<BoxBody> {
    let not_found = || {
        Problem::new(
            ProblemCode::NotFound,
            "no job with this id for this account",
        )
        .into_response()
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return not_found();
    }
    let rest = &req.uri().path()[JOBS_PATH.len()..];
    let (id, result) = match rest.strip_suffix("/result") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    if id.is_empty() || id.contains('/') {
        return not_found();
    }
    let record = match guard.store().get(&RecordId(id.to_string())).await {
        Ok(Some(r)) if r.class == oncely_core::Class::Job => r,
        Ok(_) => return not_found(),
        Err(e) => {
            tracing::error!(target: "oncely::store", error = %e, "ledger unavailable; job status not answered");
            return Problem::new(
                ProblemCode::StoreUnavailable,
                "the ledger cannot be reached",
            )
            .into_response();
        }
    };
    let Some(policy) = guard.jobs.route(&record.route) else {
        return not_found();
    };
    let principal = policy
        .principal
        .make_principal(&RequestHead::of(req))
        .map(|raw| guard.principal_hash(&raw));
    if principal.as_deref() != Some(record.principal.as_str()) {
        return not_found();
    }
    let mut res = if !result {
        json_response(StatusCode::OK, &job_json(&record))
    } else {
        result_response(&record, policy.wait)
    };
    if let Ok(v) = HeaderValue::from_str(record.id.as_str()) {
        res.headers_mut().insert(ONCELY_RECORD, v);
    }
    res
}

fn result_response(record: &Record, wait: Duration) -> Response<BoxBody> {
    match (record.state, &record.response) {
        (State::Completed, Some(stored)) if stored.body.is_some() => {
            let mut res = Response::new(full(stored.body.clone().unwrap_or_default()));
            *res.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
            let h = res.headers_mut();
            crate::headers::replay_headers(&stored.headers, h);
            h.insert(ONCELY_STATUS, HeaderValue::from_static("replayed"));
            h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            res
        }
        (State::Completed, _) => Problem::new(
            ProblemCode::ResultTooLarge,
            "the job completed, but its answer was too large to keep",
        )
        .with_original_at(record.created_at)
        .into_response(),
        (State::Processing, _) => {
            let secs = retry_after(wait).as_secs().max(1);
            Problem::new(
                ProblemCode::InFlight,
                format!("the job is still running; ask again in {secs} seconds"),
            )
            .with_retry_after(secs)
            .with_original_at(record.created_at)
            .into_response()
        }
        (State::OutcomeUnknown, _) => Problem::new(
            ProblemCode::OutcomeUnknown,
            "the job may or may not have taken effect; it awaits reconciliation",
        )
        .with_original_at(record.created_at)
        .into_response(),
        (State::Released, _) => Problem::new(
            ProblemCode::JobFailed,
            "the job failed; send the original request again to run it again",
        )
        .with_original_at(record.created_at)
        .into_response(),
    }
}

/// How a [`JobWorker`] runs.
#[derive(Debug, Clone)]
pub struct JobWorkerOptions {
    /// Jobs in flight at once per route without a `concurrency` of its own.
    pub default_concurrency: usize,
    /// How often to look for due jobs without a wake-up (other instances' jobs, jobs
    /// whose worker died).
    pub poll_interval: Duration,
}

impl Default for JobWorkerOptions {
    fn default() -> JobWorkerOptions {
        JobWorkerOptions {
            default_concurrency: 64,
            poll_interval: Duration::from_millis(500),
        }
    }
}

/// Runs the queued jobs of some routes through an inner service (the gateway's proxy).
/// Stop it with [`JobWorker::stop`].
#[derive(Debug)]
pub struct JobWorker {
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<()>,
}

impl JobWorker {
    /// Starts leasing and running the jobs of `routes` (the `job` routes) on the current
    /// runtime.
    pub fn start<S, ResBody>(
        guard: Arc<Guard>,
        routes: Vec<Arc<RoutePolicy>>,
        inner: S,
        options: JobWorkerOptions,
    ) -> JobWorker
    where
        S: Service<Request<BoxBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        ResBody: http_body::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        for r in &routes {
            guard.jobs.register_route(r.clone());
        }
        let (stop, stopped) = watch::channel(false);
        let handle = tokio::spawn(work(guard, routes, inner, options, stopped));
        JobWorker { stop, handle }
    }

    /// Stops leasing new jobs. Jobs already running run on; [`Guard::drain`] waits for
    /// them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.handle.await;
    }
}

async fn work<S, ResBody>(
    guard: Arc<Guard>,
    routes: Vec<Arc<RoutePolicy>>,
    inner: S,
    options: JobWorkerOptions,
    mut stopped: watch::Receiver<bool>,
) where
    S: Service<Request<BoxBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    if routes.is_empty() {
        return;
    }
    let owner = format!("{}/jobs", guard.instance());
    let mut running: JoinSet<()> = JoinSet::new();
    loop {
        if *stopped.borrow() {
            break;
        }
        while running.try_join_next().is_some() {}
        for policy in &routes {
            let kind = task_kind(&policy.name);
            // The route's `concurrency` is shared by every instance on the store: the
            // store counts the live leases and leases what is left in one step.
            let limit = policy
                .concurrency
                .as_ref()
                .map_or(options.default_concurrency, |c| c.limit)
                .max(1);
            let tasks = match guard
                .store()
                .lease_tasks_capped(&kind, &owner, limit, task_lease(policy))
                .await
            {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(target: "oncely::jobs", route = %policy.name, error = %e, "cannot lease jobs");
                    continue;
                }
            };
            for task in tasks {
                let guard = guard.clone();
                let policy = policy.clone();
                let inner = inner.clone();
                let token = guard.engine().start_task();
                running.spawn(async move {
                    let _token = token;
                    let Some(fence) = task.fence() else { return };
                    let store = guard.store().clone();
                    let run = run_job(&guard, &policy, inner, task);
                    while_leased(&*store, &fence, task_lease(&policy), run).await;
                });
            }
        }
        tokio::select! {
            _ = guard.jobs.woken() => {}
            _ = tokio::time::sleep(options.poll_interval) => {}
            Some(_) = running.join_next(), if !running.is_empty() => {}
            _ = stopped.changed() => {}
        }
    }
    // Running jobs are counted by the guard's task count: `Guard::drain` waits for them.
    running.detach_all();
}

/// Runs one leased job to its end and finishes its task.
async fn run_job<S, ResBody>(guard: &Guard, policy: &RoutePolicy, inner: S, task: Task)
where
    S: Service<Request<BoxBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let store = guard.store();
    let Some(task_fence) = task.fence() else {
        return;
    };
    let finish = |outcome: TaskOutcome, why: &'static str| {
        let store = store.clone();
        let fence = task_fence.clone();
        async move {
            if let Err(e) = store.finish_task(&fence, outcome).await {
                tracing::warn!(target: "oncely::jobs", task = %fence.id, error = %e, "could not finish the job's task ({why})");
            }
        }
    };
    let Some(id) = task.record.clone() else {
        return finish(
            TaskOutcome::Dead {
                error: "a job task without a record".into(),
            },
            "no record",
        )
        .await;
    };
    let record = match store.get(&id).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            tracing::info!(target: "oncely::jobs", record = %id, "job's record is gone; dropping its task");
            return finish(TaskOutcome::Done, "record gone").await;
        }
        Err(e) => {
            tracing::warn!(target: "oncely::jobs", record = %id, error = %e, "cannot read a job's record; retrying");
            return retry_later(guard, &task_fence, policy.lease, e.to_string()).await;
        }
    };
    // The first run executes under the claim the request made; a later run is a take
    // over of a worker that died (attempt + 1, same downstream key).
    let seen = Seen {
        fingerprint: record.fingerprint,
        claimant: Claimant::JobWorker {
            first_run: task.attempts <= 1,
        },
        waited: false,
        wait_left: Duration::ZERO,
    };
    let mut now = None;
    let record = loop {
        match decide(&record, &seen, now) {
            Decided::Refuse(Refusal::Ended) => {
                // Its last worker recorded it and died before finishing the task.
                tracing::info!(target: "oncely::jobs", record = %id, state = %record.state, "job already ended; dropping its task");
                return finish(TaskOutcome::Done, "already ended").await;
            }
            Decided::Own => break record,
            Decided::ReadClock => match store.now().await {
                Ok(n) => now = Some(n),
                Err(e) => {
                    return retry_later(guard, &task_fence, policy.lease, e.to_string()).await
                }
            },
            Decided::WaitUntil(lease_until) => {
                let at = lease_until.or(now).expect("the clock was read");
                return finish(
                    TaskOutcome::Retry {
                        at,
                        error: "the record is still leased by an earlier run".into(),
                    },
                    "record still leased",
                )
                .await;
            }
            Decided::TakeOver => match store
                .take_over(
                    &record.id,
                    record.attempt,
                    &guard.engine().new_owner(),
                    policy.lease,
                )
                .await
            {
                Ok(TakeOverOutcome::Owned(r)) => {
                    tracing::info!(target: "oncely::jobs", record = %r.id, attempt = r.attempt, "job's earlier worker stopped mid-call; running it again");
                    break r;
                }
                Ok(TakeOverOutcome::OutcomeUnknown(r)) => {
                    tracing::info!(target: "oncely::jobs", record = %r.id, "job's earlier worker stopped mid-call; outcome unknown");
                    return finish(TaskOutcome::Done, "outcome unknown").await;
                }
                Err(e) => {
                    tracing::warn!(target: "oncely::jobs", record = %record.id, error = %e, "cannot take over a job");
                    return retry_later(guard, &task_fence, policy.lease, e.to_string()).await;
                }
            },
            step => unreachable!("a job worker is never told {step:?}"),
        }
    };
    let Some(fence) = record.fence() else {
        return finish(TaskOutcome::Done, "no owner").await;
    };
    let job = match JobRequest::from_task(&task, guard.job_key.as_ref()) {
        Ok(j) => j,
        Err(e) => {
            let _ = store.release(&fence, Some(e.clone()), policy.window).await;
            tracing::warn!(target: "oncely::jobs", record = %record.id, error = %e, "job released: unreadable task");
            return finish(TaskOutcome::Done, "unreadable").await;
        }
    };
    let key = DownstreamKey::derive(&record.scope, &record.key);
    let units = policy.units.request_units(
        &RequestHead {
            method: &job.method,
            target: &job.target,
            headers: &job.headers,
        },
        &job.body,
    );
    let call = policy.guarded_call(
        record.principal.clone(),
        Some(record.key.clone()),
        record.fingerprint,
        record.workflow_id.clone(),
        units,
    );
    let mut req = job.upstream_request(&key);
    // The inner service finds the route, and that the owner holds its slot and times it.
    req.extensions_mut().insert(policy.clone());
    req.extensions_mut().insert(crate::upstream::OwnerSend);
    // The submission left its span as the stored `traceparent`: the run continues it.
    let span = guard
        .tracer()
        .and_then(|t| t.start_client_under(req.headers(), format!("upstream {}", req.method())))
        .map(|mut span| {
            span.set(crate::trace::attr::HTTP_METHOD, req.method().as_str());
            span.set(crate::trace::attr::RECORD, record.id.as_str());
            span.set(crate::trace::attr::ROUTE, record.route.as_str());
            span.set(crate::trace::attr::ATTEMPT, i64::from(record.attempt));
            span.propagate(req.headers_mut());
            crate::trace::ClientSpan::new(span)
        });
    let upstream = crate::guard::to_engine(crate::upstream::traced(
        crate::upstream::call_upstream(inner, req, policy.units.clone()),
        span,
    ));
    // The head goes to the first request if it waits on this instance (else it is only
    // recorded); the upstream's status and request id are noted for the log line.
    let waiter = guard.jobs.take_head(&record.id);
    let (head, seen) = oneshot::channel();
    let relay = async move {
        let head = seen.await.ok()?;
        let noted = match &head {
            Head::Answer {
                status,
                head: headers,
                ..
            } => Some((*status, provider_request_id(headers))),
            Head::Failed { .. } => None,
        };
        if let Some(waiter) = waiter {
            let _ = waiter.send(head);
        }
        noted
    };
    tracing::info!(target: "oncely::jobs", record = %record.id, route = %record.route, attempt = record.attempt, "job started");
    let started = Instant::now();
    let ((), noted) = tokio::join!(
        guard
            .engine()
            .run_owned(record.clone(), fence.clone(), call, upstream, head),
        relay
    );
    match store.get(&record.id).await {
        Ok(Some(r)) if r.state == State::Processing && r.attempt == fence.attempt => {
            // The owner could not write its outcome: run again once its lease lapses.
            retry_later(
                guard,
                &task_fence,
                policy.lease,
                "the outcome was not recorded".into(),
            )
            .await
        }
        Ok(Some(after)) if after.attempt == fence.attempt => {
            let (upstream_status, provider) = noted.unzip();
            log_job(&RequestLog {
                record: Some(after.id.to_string()),
                route: &after.route,
                principal: Some(&after.principal),
                status: job_status(&after),
                attempt: Some(after.attempt),
                workflow_id: after.workflow_id.as_deref(),
                upstream_status,
                provider_request_id: provider.flatten().or(after.provider_request_id.clone()),
                started,
                span: None,
            });
            finish(TaskOutcome::Done, "done").await
        }
        Ok(after) => {
            // Taken over by a later run (which logs its own end), or purged.
            let state = after.as_ref().map(|r| r.state.as_str()).unwrap_or("gone");
            tracing::info!(target: "oncely::jobs", record = %record.id, route = %record.route, attempt = record.attempt, state, "job run superseded");
            finish(TaskOutcome::Done, "done").await
        }
        Err(e) => retry_later(guard, &task_fence, policy.lease, e.to_string()).await,
    }
}

async fn retry_later(
    guard: &Guard,
    fence: &oncely_store::TaskFence,
    after: Duration,
    error: String,
) {
    let at = match guard.store().now().await {
        Ok(now) => now.plus(after),
        // The store is down: the task's lease lapses and it is leased again anyway.
        Err(_) => return,
    };
    if let Err(e) = guard
        .store()
        .finish_task(fence, TaskOutcome::Retry { at, error })
        .await
    {
        tracing::warn!(target: "oncely::jobs", task = %fence.id, error = %e, "could not reschedule a job");
    }
}
