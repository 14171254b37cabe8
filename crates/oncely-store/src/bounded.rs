//! The bound of every store operation: [`Bounded`] wraps a backend so that each of its
//! operations answers within [`ANSWER_WITHIN`] or fails with
//! [`StoreError::Unavailable`], whichever caller asked (a guarded request, a job's
//! submission or status, a webhook's ingress, the admin API, a worker, the CLI). A
//! database that holds its connections open without answering (a paused server, a storage
//! stall, a black-holed network path, a SQLite write lock held by another process) is
//! thereby the same case as one that is down.
//!
//! `oncely_store::open` hands out every backend wrapped, so no entry point can forget the
//! bound. The exceptions are the operations whose length is their caller's to choose:
//! [`Waiting::wait_for`] gets its own timeout plus the bound, and
//! [`Admin::purge_expired`] runs as paced [`Admin::purge_step`]s, each bounded.
//!
//! What gives up must leave nothing behind that a later operation trips over. A
//! statement sent before the bound ran out may still reach the database after it (the
//! server resumes and runs what it had been sent). Reads and fenced writes are harmless
//! then: a late completion, release or renewal is what its owner wanted, and the owner
//! retries or its fence refuses a stale one. A late *claim* would leave a record owned
//! by nobody, blocking its retries until the lease lapsed: so [`Ledger::claim`] and
//! [`Ledger::take_over`] run on a task of their own that outlives the bound, and one
//! that lands after it is released at once, unsent, and the caller's retry claims the
//! record again (a released record with the same fingerprint is reclaimed).
//!
//! A late [`TaskQueue::claim_with_task`] (a job's submission, a webhook's ingress) is
//! made harmless the other way: it stands. Its record is owned by its task, which a
//! worker runs once, and the caller, told that the ledger did not answer (503 with
//! `X-Should-Retry: true`), finds the job or the event when it asks again. Undoing it
//! instead would race that worker: a release landing after the worker read the record
//! would leave an execution without a record, and the retry would run it again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use oncely_core::{
    ClaimSpec, Completion, Fence, Record, RecordId, Resolution, Scope, TakeOverOutcome, Timestamp,
};

use crate::queue::{Finished, NewTask, Task, TaskCounts, TaskFence, TaskId, TaskOutcome};
use crate::{
    Admin, ChurnEntry, ChurnFilter, Claim, Ledger, ListFilter, PurgeStep, ReconcileSchedule,
    Repeat, RepeatEvents, Result, Store, StoreError, TaskQueue, TaskState, Usage, UsageHour,
    Waiting,
};

/// The longest one store operation may take before it counts as failed: a store that
/// holds a connection open without answering must not hold the request, the worker or
/// the command that asked with it. Well within a route's default `wait` (20 s) and
/// `lease` (30 s).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// What an operation that took its bound failed with.
pub fn unanswered(within: Duration) -> StoreError {
    StoreError::Unavailable(format!(
        "the ledger did not answer within {}s",
        within.as_secs_f64()
    ))
}

/// A store whose every operation answers within a bound (module docs).
#[derive(Debug, Clone)]
pub struct Bounded {
    inner: Arc<dyn Store>,
    within: Duration,
}

impl Bounded {
    /// `inner`, each operation bounded by `within`.
    pub fn new(inner: Arc<dyn Store>, within: Duration) -> Bounded {
        Bounded { inner, within }
    }

    async fn bound<T>(&self, op: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.within, op)
            .await
            .unwrap_or_else(|_| Err(unanswered(self.within)))
    }

    /// Runs `op` on a task of its own, answering within the bound; an answer that comes
    /// after it is handed to `late` (on that task), to undo what it made.
    async fn owning<T, Op, Late>(&self, op: Op, late: Late) -> Result<T>
    where
        T: Send + 'static,
        Op: Future<Output = Result<T>> + Send + 'static,
        Late: FnOnce(Arc<dyn Store>, T) -> futures::future::BoxFuture<'static, ()> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let answer = op.await;
            if let Err(Ok(value)) = tx.send(answer) {
                late(inner, value).await;
            }
        });
        match tokio::time::timeout(self.within, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the ledger operation's task ended without an answer".into(),
            )),
            // Dropping the receiver hands a later answer to `late`.
            Err(_) => Err(unanswered(self.within)),
        }
    }
}

/// Releases `record` if it is owned: the claim that made it landed after its caller was
/// told the ledger did not answer, so nothing was sent for it.
fn release_late(
    store: Arc<dyn Store>,
    record: Record,
    window: Duration,
) -> futures::future::BoxFuture<'static, ()> {
    Box::pin(async move {
        let Some(fence) = record.fence() else {
            return;
        };
        let why = "the ledger answered the claim too late: nothing was sent";
        tracing::warn!(record = %record.id, "{why}; releasing it");
        let released = tokio::time::timeout(
            ANSWER_WITHIN,
            store.release(&fence, Some(why.into()), window),
        )
        .await;
        match released {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(record = %record.id, error = %e,
                "releasing a late claim failed; its lease will lapse"),
            Err(_) => tracing::warn!(record = %record.id,
                "releasing a late claim got no answer; its lease will lapse"),
        }
    })
}

#[async_trait]
impl Ledger for Bounded {
    async fn claim(&self, spec: &ClaimSpec) -> Result<Claim> {
        let inner = self.inner.clone();
        let spec = spec.clone();
        let window = spec.lease;
        self.owning(
            async move { inner.claim(&spec).await },
            move |store, claim| match claim {
                Claim::Owned(record) => release_late(store, record, window),
                Claim::Existing(_) => Box::pin(async {}),
            },
        )
        .await
    }

    async fn complete(&self, fence: &Fence, completion: Completion) -> Result<Record> {
        self.bound(self.inner.complete(fence, completion)).await
    }

    async fn release(
        &self,
        fence: &Fence,
        error: Option<String>,
        window: Duration,
    ) -> Result<Record> {
        self.bound(self.inner.release(fence, error, window)).await
    }

    async fn mark_unknown(&self, fence: &Fence, error: String) -> Result<Record> {
        self.bound(self.inner.mark_unknown(fence, error)).await
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<()> {
        self.bound(self.inner.renew(fence, lease)).await
    }

    async fn take_over(
        &self,
        id: &RecordId,
        expected_attempt: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<TakeOverOutcome> {
        let inner = self.inner.clone();
        let (id, owner) = (id.clone(), owner.to_owned());
        self.owning(
            async move { inner.take_over(&id, expected_attempt, &owner, lease).await },
            move |store, outcome| match outcome {
                TakeOverOutcome::Owned(record) => release_late(store, record, lease),
                TakeOverOutcome::OutcomeUnknown(_) => Box::pin(async {}),
            },
        )
        .await
    }

    async fn get(&self, id: &RecordId) -> Result<Option<Record>> {
        self.bound(self.inner.get(id)).await
    }

    async fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<Record>> {
        self.bound(self.inner.lookup(scope, key)).await
    }

    async fn resolve(&self, id: &RecordId, resolution: Resolution) -> Result<Record> {
        self.bound(self.inner.resolve(id, resolution)).await
    }

    async fn record_repeats(
        &self,
        id: &RecordId,
        principal: &str,
        route: &str,
        repeats: &[Repeat],
    ) -> Result<()> {
        self.bound(self.inner.record_repeats(id, principal, route, repeats))
            .await
    }

    async fn now(&self) -> Result<Timestamp> {
        self.bound(self.inner.now()).await
    }

    async fn ping(&self) -> Result<()> {
        self.bound(self.inner.ping()).await
    }

    fn churn_filter(&self) -> Option<&ChurnFilter> {
        self.inner.churn_filter()
    }

    async fn churn_get(&self, hash: &[u8; 16]) -> Result<Option<ChurnEntry>> {
        self.bound(self.inner.churn_get(hash)).await
    }

    async fn churn_put(&self, entry: &ChurnEntry) -> Result<bool> {
        self.bound(self.inner.churn_put(entry)).await
    }

    async fn churn_forget(&self, id: &RecordId) -> Result<()> {
        self.bound(self.inner.churn_forget(id)).await
    }

    async fn churn_of(&self, id: &RecordId) -> Result<Vec<ChurnEntry>> {
        self.bound(self.inner.churn_of(id)).await
    }
}

#[async_trait]
impl Waiting for Bounded {
    async fn wait_for(&self, id: &RecordId, timeout: Duration) -> Result<Record> {
        let within = timeout.saturating_add(self.within);
        tokio::time::timeout(within, self.inner.wait_for(id, timeout))
            .await
            .unwrap_or_else(|_| Err(unanswered(self.within)))
    }
}

#[async_trait]
impl TaskQueue for Bounded {
    async fn claim_with_task(
        &self,
        specs: &[ClaimSpec],
        completion: Option<Completion>,
        task: NewTask,
    ) -> Result<Claim> {
        let inner = self.inner.clone();
        let specs = specs.to_vec();
        self.owning(
            async move { inner.claim_with_task(&specs, completion, task).await },
            // The work was queued after its caller was told the ledger did not answer:
            // its worker runs it once, and the caller's retry finds it.
            |_, claim| {
                if let Claim::Owned(record) = claim {
                    tracing::warn!(record = %record.id, "the ledger queued work after its \
                        caller was told it did not answer; it runs once, and a retry finds it");
                }
                Box::pin(async {})
            },
        )
        .await
    }

    async fn lease_tasks(
        &self,
        kind: &str,
        owner: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        // A lease that lands late lapses unrenewed and the task is leased again.
        self.bound(self.inner.lease_tasks(kind, owner, max, lease))
            .await
    }

    async fn lease_tasks_capped(
        &self,
        kind: &str,
        owner: &str,
        max_running: usize,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        self.bound(
            self.inner
                .lease_tasks_capped(kind, owner, max_running, lease),
        )
        .await
    }

    async fn renew_task(&self, fence: &TaskFence, lease: Duration) -> Result<()> {
        self.bound(self.inner.renew_task(fence, lease)).await
    }

    async fn finish_task(&self, fence: &TaskFence, outcome: TaskOutcome) -> Result<Finished> {
        self.bound(self.inner.finish_task(fence, outcome)).await
    }

    async fn get_task(&self, id: &TaskId) -> Result<Option<Task>> {
        self.bound(self.inner.get_task(id)).await
    }

    async fn list_tasks(&self, kind: &str, state: Option<TaskState>) -> Result<Vec<Task>> {
        self.bound(self.inner.list_tasks(kind, state)).await
    }

    async fn requeue_task(&self, id: &TaskId) -> Result<Task> {
        self.bound(self.inner.requeue_task(id)).await
    }

    async fn task_counts(&self, kind: &str) -> Result<TaskCounts> {
        self.bound(self.inner.task_counts(kind)).await
    }
}

#[async_trait]
impl Admin for Bounded {
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        self.bound(self.inner.list(filter)).await
    }

    // `purge_expired` is the trait's: paced steps of this store, each bounded.

    async fn purge_step(&self) -> Result<PurgeStep> {
        self.bound(self.inner.purge_step()).await
    }

    async fn purge_usage(&self, before: Timestamp) -> Result<u64> {
        self.bound(self.inner.purge_usage(before)).await
    }

    async fn usage_by_hour(&self, since: Option<Timestamp>) -> Result<Vec<UsageHour>> {
        self.bound(self.inner.usage_by_hour(since)).await
    }

    async fn repeat_events(
        &self,
        principal: &str,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<RepeatEvents> {
        self.bound(self.inner.repeat_events(principal, since, limit))
            .await
    }

    async fn usage(&self, since: Option<Timestamp>) -> Result<Usage> {
        self.bound(self.inner.usage(since)).await
    }

    async fn secret(&self, name: &str) -> Result<Vec<u8>> {
        self.bound(self.inner.secret(name)).await
    }

    async fn reconcile_schedule(&self, id: &RecordId) -> Result<Option<ReconcileSchedule>> {
        self.bound(self.inner.reconcile_schedule(id)).await
    }

    async fn schedule_reconcile(
        &self,
        id: &RecordId,
        seen: ReconcileSchedule,
        next: ReconcileSchedule,
    ) -> Result<bool> {
        self.bound(self.inner.schedule_reconcile(id, seen, next))
            .await
    }
}
