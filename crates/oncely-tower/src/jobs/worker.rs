//! The worker: a [`JobWorker`] per gateway instance leases the due tasks of its `job`
//! routes, at most a route's `concurrency` running on all instances together, keeps each
//! task's lease renewed while its job runs, and runs it through the engine's owner (the
//! first run under the claim its request made, a later one as a take-over with
//! attempt + 1 and the same downstream key). Then it finishes the task, or schedules it
//! again when the outcome could not be recorded, and writes the job's log line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response};
use oncely_core::{Claimant, DownstreamKey, Record, RecordId, Refusal, State, Step};
use oncely_engine::{Claimed, Claimer, Claiming, Verdict};
use oncely_store::queue::while_leased;
use oncely_store::{StoreError, Task, TaskOutcome};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tower::Service;

use super::request::{task_kind, JobRequest};
use super::status::job_status;
use crate::guard::Guard;
use crate::job_board::Head;
use crate::log::{log_job, provider_request_id, RequestLog};
use crate::policy::RoutePolicy;
use crate::sources::RequestHead;
use crate::{BoxBody, BoxError};

/// How long a worker's lease on a job task lasts without renewal: the route's `lease`,
/// like its record's. The worker renews both while the job runs, so the slot, the task
/// and the record of a worker that died are taken up again about one `lease` later.
pub fn task_lease(policy: &RoutePolicy) -> Duration {
    policy.lease
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
    // The first run executes under the claim the request made; a later run is a take
    // over of a worker that died (attempt + 1, same downstream key). The claim table
    // says which, the claim loop carries it out.
    let claiming = Claiming {
        claimant: Claimant::JobWorker {
            first_run: task.attempts <= 1,
        },
        fingerprint: None,
        deadline: tokio::time::Instant::now(),
        now: None,
    };
    let mut claimer = JobRun {
        guard,
        id: &id,
        lease: policy.lease,
    };
    let record = match guard.engine().claim(&mut claimer, claiming).await {
        Verdict::Decided {
            step: Step::Own,
            record,
            ..
        } => record,
        Verdict::Owned(r) => {
            tracing::info!(target: "oncely::jobs", record = %r.id, attempt = r.attempt, "job's earlier worker stopped mid-call; running it again");
            r
        }
        Verdict::Decided {
            step: Step::Refuse(Refusal::Ended),
            record,
            ..
        } => {
            // Its last worker recorded it and died before finishing the task.
            tracing::info!(target: "oncely::jobs", record = %id, state = %record.state, "job already ended; dropping its task");
            return finish(TaskOutcome::Done, "already ended").await;
        }
        Verdict::Unknown(r) => {
            tracing::info!(target: "oncely::jobs", record = %r.id, "job's earlier worker stopped mid-call; outcome unknown");
            return finish(TaskOutcome::Done, "outcome unknown").await;
        }
        Verdict::Decided {
            step: Step::WaitUntil(at),
            ..
        } => {
            return finish(
                TaskOutcome::Retry {
                    at: at.expect("the clock was read"),
                    error: "the record is still leased by an earlier run".into(),
                },
                "record still leased",
            )
            .await;
        }
        // An owner task of this instance's still runs it (its renewals did not land
        // while the store stalled), or the store still holds the earlier run's lease (it
        // has not watched it lapse for a whole lease yet): try the task again later.
        Verdict::LeaseHeld(record) => {
            tracing::info!(target: "oncely::jobs", record = %record.id, "job's record is still leased by an earlier run; its task is retried later");
            return retry_later(
                guard,
                &task_fence,
                policy.lease,
                "the record is still leased by an earlier run".into(),
            )
            .await;
        }
        Verdict::Gone => {
            tracing::info!(target: "oncely::jobs", record = %id, "job's record is gone; dropping its task");
            return finish(TaskOutcome::Done, "record gone").await;
        }
        Verdict::Unavailable(e) => {
            tracing::warn!(target: "oncely::jobs", record = %id, error = %e, "cannot read or take over a job's record; retrying");
            return retry_later(guard, &task_fence, policy.lease, e.to_string()).await;
        }
        Verdict::Decided { step, .. } => unreachable!("a job worker is never told {step:?}"),
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
    let mut call = policy.call(record.identity.clone(), units);
    let mut req = job.upstream_request(&key);
    // The inner service finds the route, and that the owner holds its slot and times it.
    req.extensions_mut().insert(policy.clone());
    req.extensions_mut().insert(crate::upstream::OwnerSend);
    // The submission left its span as the stored `traceparent`: the run continues it.
    let span = guard
        .tracer()
        .and_then(|t| t.start_client_under(req.headers(), req.method().to_string()))
        .map(|mut span| {
            span.set(crate::trace::attr::HTTP_METHOD, req.method().as_str());
            span.set(crate::trace::attr::RECORD, record.id.as_str());
            span.set(
                crate::trace::attr::HTTP_ROUTE,
                crate::trace::route_path(&record.route),
            );
            span.set(crate::trace::attr::ATTEMPT, i64::from(record.attempt));
            span.propagate(req.headers_mut());
            let span = crate::trace::ClientSpan::new(span);
            // The proxy names the upstream's URL on it.
            req.extensions_mut().insert(span.attributes());
            span
        });
    // The record keeps the run's span: a repeat of the job links to its execution.
    call.trace = span.as_ref().and_then(crate::trace::ClientSpan::span_ref);
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

/// A job's run: it reads its record (the request claimed it), and takes it over when
/// the earlier run's lease lapsed, as a new owner of this instance's.
struct JobRun<'a> {
    guard: &'a Guard,
    id: &'a RecordId,
    lease: Duration,
}

impl Claimer for JobRun<'_> {
    type Owned = Record;

    fn claim(&mut self) -> BoxFuture<'_, Result<Claimed<Record>, StoreError>> {
        Box::pin(async move {
            Ok(match self.guard.store().get(self.id).await? {
                Some(record) => Claimed::Found(record),
                None => Claimed::Gone,
            })
        })
    }

    fn take_over<'a>(
        &'a mut self,
        found: &'a Record,
    ) -> BoxFuture<'a, Result<Claimed<Record>, StoreError>> {
        let owner = self.guard.engine().new_owner();
        Box::pin(async move {
            self.guard
                .store()
                .take_over(&found.id, found.attempt, &owner, self.lease)
                .await
                .map(Claimed::from)
        })
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
