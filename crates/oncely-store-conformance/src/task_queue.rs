//! The [`TaskQueue`] section: claims that enqueue work all or nothing, leases never
//! shared, lapsed leases, renewals, retries, dead tasks, capped leasing. One concept,
//! kept in one file: the contract of one trait of `oncely_store`, a test a rule, as
//! `task_queue_tests!` lists them and a backend author reads them. Its rules are one
//! task's life (claimed with its record, leased, renewed, retried, finished or dead), so
//! a split by operation would cut that life apart.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use oncely_core::{ClaimSpec, Class, State, TransitionError};
use oncely_store::queue::{Finished, NewTask, TaskCounts, TaskError, TaskOutcome, TaskState};
use oncely_store::{Claim, Ledger, StoreError, TaskQueue};

use crate::{completion, existing, new_task, owned, spec, Harness, LEASE, WINDOW};

fn webhook_spec(key: &str) -> ClaimSpec {
    spec("stripe", key, "{}", Class::Webhook, "ingress")
}

/// Enqueues one task under `key`; panics unless the claim was new.
async fn enqueue<S: TaskQueue + ?Sized>(
    store: &Arc<S>,
    key: &str,
    max_attempts: u32,
) -> oncely_store::Task {
    let record = owned(
        store
            .claim_with_task(
                &[webhook_spec(key)],
                Some(completion("", 0)),
                new_task(&format!("{{\"key\":\"{key}\"}}"), max_attempts),
            )
            .await
            .unwrap(),
    );
    let tasks = store.list_tasks("webhook", None).await.unwrap();
    tasks
        .into_iter()
        .find(|t| t.record.as_ref() == Some(&record.id))
        .expect("the task of a new claim is queued")
}

/// A claim with a task is all or nothing: one existing claim means no record and no task.
pub async fn queue_claim_with_task_is_all_or_nothing<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + TaskQueue,
{
    let store = h.store().await;
    let held = owned(store.claim(&webhook_spec("a")).await.unwrap());
    let refused = existing(
        store
            .claim_with_task(
                &[webhook_spec("b"), webhook_spec("a")],
                Some(completion("", 0)),
                new_task("{}", 3),
            )
            .await
            .unwrap(),
    );
    assert_eq!(refused.id, held.id, "the existing claim is reported");
    assert_eq!(
        store.lookup(&held.scope, "b").await.unwrap(),
        None,
        "b not written"
    );
    assert!(store.list_tasks("webhook", None).await.unwrap().is_empty());

    let first = owned(
        store
            .claim_with_task(
                &[webhook_spec("b"), webhook_spec("c")],
                Some(completion("", 0)),
                new_task("{\"n\":1}", 3),
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        first.state,
        State::Completed,
        "completed with the completion"
    );
    let c = store
        .lookup(&held.scope, "c")
        .await
        .unwrap()
        .expect("c written");
    assert_eq!(c.state, State::Completed);
    let tasks = store.list_tasks("webhook", None).await.unwrap();
    assert_eq!(tasks.len(), 1);
    let t = &tasks[0];
    assert_eq!(t.record.as_ref(), Some(&first.id));
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!(t.attempts, 0);
    assert_eq!(t.max_attempts, 3);
    assert_eq!(t.body, b"{\"n\":1}");
    assert_eq!(t.header("Idempotency-Key"), Some("evt_1"));
    assert_eq!(t.timeout, Duration::from_secs(5));
    assert_eq!(t.backoff, Duration::from_millis(10));
    assert_eq!(store.get_task(&t.id).await.unwrap().as_ref(), Some(t));
    // Either spec alone is now a duplicate.
    existing(
        store
            .claim_with_task(&[webhook_spec("c")], None, new_task("{}", 3))
            .await
            .unwrap(),
    );
    assert_eq!(store.list_tasks("webhook", None).await.unwrap().len(), 1);
    // Without a completion the records stay processing, owned by their claimant.
    let job = owned(
        store
            .claim_with_task(&[webhook_spec("d")], None, new_task("{}", 3))
            .await
            .unwrap(),
    );
    assert_eq!(job.state, State::Processing);
    assert_eq!(job.owner.as_deref(), Some("ingress"));
    assert_eq!(
        store.task_counts("webhook").await.unwrap(),
        TaskCounts {
            pending: 2,
            running: 0,
            dead: 0
        }
    );
    assert_eq!(
        store.task_counts("job").await.unwrap(),
        TaskCounts::default()
    );
}

/// 100 concurrent claims of one event id over two instances: one record, one task.
pub async fn queue_concurrent_claims_enqueue_once<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + TaskQueue,
{
    let a = h.store().await;
    let b = h.second().await;
    let mut joins = Vec::new();
    for i in 0..100 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        joins.push(tokio::spawn(async move {
            store
                .claim_with_task(
                    &[webhook_spec("evt_hot")],
                    Some(completion("", 0)),
                    new_task(&format!("{{\"i\":{i}}}"), 3),
                )
                .await
                .unwrap()
        }));
    }
    let mut owners = 0;
    let mut ids = HashSet::new();
    for j in joins {
        let claim = j.await.unwrap();
        if matches!(claim, Claim::Owned(_)) {
            owners += 1;
        }
        ids.insert(claim.record().id.clone());
    }
    assert_eq!(owners, 1, "exactly one of 100 claims is new");
    assert_eq!(ids.len(), 1, "every claimant sees the same record");
    assert_eq!(a.list_tasks("webhook", None).await.unwrap().len(), 1);
}

/// Two instances leasing concurrently never get the same task.
pub async fn queue_concurrent_leases_never_share<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + TaskQueue,
{
    let a = h.store().await;
    let b = h.second().await;
    for i in 0..40 {
        enqueue(&a, &format!("e{i}"), 3).await;
    }
    let mut joins = Vec::new();
    for w in 0..6 {
        let store = if w % 2 == 0 { a.clone() } else { b.clone() };
        joins.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let leased = store
                    .lease_tasks("webhook", &format!("w{w}"), 3, LEASE)
                    .await
                    .unwrap();
                if leased.is_empty() {
                    return got;
                }
                for t in &leased {
                    assert_eq!(t.state, TaskState::Running);
                    assert_eq!(t.attempts, 1);
                    assert_eq!(t.owner.as_deref(), Some(format!("w{w}").as_str()));
                }
                got.extend(leased.into_iter().map(|t| t.id));
            }
        }));
    }
    let mut all = Vec::new();
    for j in joins {
        all.extend(j.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), 40, "each task leased exactly once: {all:?}");
    assert_eq!(unique.len(), 40);
    assert_eq!(
        a.task_counts("webhook").await.unwrap(),
        TaskCounts {
            pending: 0,
            running: 40,
            dead: 0
        }
    );
    assert!(a
        .lease_tasks("job", "w", 10, LEASE)
        .await
        .unwrap()
        .is_empty());
}

/// A lapsed lease is leased again with attempt + 1; the stale holder cannot finish it.
pub async fn queue_lapsed_lease_is_leased_again_and_fenced<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + TaskQueue,
{
    let store = h.store().await;
    let second = h.second().await;
    let t = enqueue(&store, "slow", 5).await;
    let first = store.lease_tasks("webhook", "w1", 10, LEASE).await.unwrap();
    assert_eq!(first.len(), 1);
    let stale = first[0].fence().unwrap();
    assert!(second
        .lease_tasks("webhook", "w2", 10, LEASE)
        .await
        .unwrap()
        .is_empty());
    h.advance(LEASE + Duration::from_secs(1));
    let again = second
        .lease_tasks("webhook", "w2", 10, LEASE)
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "the lapsed task is due again");
    assert_eq!(again[0].id, t.id);
    assert_eq!(again[0].attempts, 2);
    assert_eq!(again[0].body, t.body, "the same body");
    assert_eq!(again[0].header("idempotency-key"), Some("evt_1"));
    let err = store
        .finish_task(&stale, TaskOutcome::Done)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { attempt: 1, .. })),
        "{err:?}"
    );
    assert_eq!(store.get_task(&t.id).await.unwrap().unwrap().attempts, 2);
    let fence = again[0].fence().unwrap();
    assert_eq!(
        second.finish_task(&fence, TaskOutcome::Done).await.unwrap(),
        Finished::Done
    );
    assert_eq!(
        store.get_task(&t.id).await.unwrap(),
        None,
        "done tasks are deleted"
    );
    let err = second
        .finish_task(&fence, TaskOutcome::Done)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { .. })),
        "{err:?}"
    );
}

/// A renewed task lease holds past its first term, on every instance and under the
/// shared cap; once renewals stop it lapses one lease later. A stale leaseholder cannot
/// renew.
pub async fn queue_renewed_lease_holds_then_lapses<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + TaskQueue,
{
    let store = h.store().await;
    let second = h.second().await;
    let t = enqueue(&store, "long", 5).await;
    let first = store.lease_tasks("webhook", "w1", 10, LEASE).await.unwrap();
    assert_eq!(first.len(), 1);
    let fence = first[0].fence().unwrap();
    for _ in 0..3 {
        h.advance(LEASE / 2);
        store.renew_task(&fence, LEASE).await.unwrap();
        assert!(
            second
                .lease_tasks("webhook", "w2", 10, LEASE)
                .await
                .unwrap()
                .is_empty(),
            "a renewed lease is not leased again"
        );
        assert!(
            second
                .lease_tasks_capped("webhook", "w2", 1, LEASE)
                .await
                .unwrap()
                .is_empty(),
            "a renewed lease holds its slot"
        );
    }
    let held = second.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!((held.state, held.attempts), (TaskState::Running, 1));
    h.advance(LEASE + Duration::from_secs(1));
    let again = second
        .lease_tasks("webhook", "w2", 10, LEASE)
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "without renewals the lease lapses");
    assert_eq!(again[0].attempts, 2);
    let err = store.renew_task(&fence, LEASE).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { attempt: 1, .. })),
        "{err:?}"
    );
    let fence = again[0].fence().unwrap();
    second.renew_task(&fence, LEASE).await.unwrap();
    second.finish_task(&fence, TaskOutcome::Done).await.unwrap();
    let err = second.renew_task(&fence, LEASE).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { .. })),
        "a finished task cannot be renewed: {err:?}"
    );
}

/// A retry waits for its time, then is leased with attempt + 1.
pub async fn queue_retry_schedules_next_at<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + TaskQueue,
{
    let store = h.store().await;
    let t = enqueue(&store, "flaky", 5).await;
    let leased = store.lease_tasks("webhook", "w", 1, LEASE).await.unwrap();
    let at = store.now().await.unwrap().plus(Duration::from_secs(10));
    let finished = store
        .finish_task(
            &leased[0].fence().unwrap(),
            TaskOutcome::Retry {
                at,
                error: "handler answered 500".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(finished, Finished::Retrying(at));
    let stored = store.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!(stored.state, TaskState::Pending);
    assert_eq!(stored.next_at, at);
    assert_eq!(stored.owner, None);
    assert_eq!(stored.last_error.as_deref(), Some("handler answered 500"));
    assert!(store
        .lease_tasks("webhook", "w", 1, LEASE)
        .await
        .unwrap()
        .is_empty());
    h.advance(Duration::from_secs(11));
    let again = store.lease_tasks("webhook", "w", 1, LEASE).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempts, 2);
}

/// After its last attempt a task is dead, keeps its body, and can be requeued.
pub async fn queue_dead_after_max_attempts_then_requeue<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + TaskQueue,
{
    let store = h.store().await;
    let t = enqueue(&store, "doomed", 2).await;
    for attempt in 1..=2 {
        h.advance(Duration::from_secs(1));
        let leased = store.lease_tasks("webhook", "w", 1, LEASE).await.unwrap();
        assert_eq!(leased.len(), 1);
        assert_eq!(leased[0].attempts, attempt);
        let at = store.now().await.unwrap();
        let finished = store
            .finish_task(
                &leased[0].fence().unwrap(),
                TaskOutcome::Retry {
                    at,
                    error: format!("attempt {attempt} failed"),
                },
            )
            .await
            .unwrap();
        let want = if attempt == 2 {
            Finished::Dead
        } else {
            Finished::Retrying(at)
        };
        assert_eq!(finished, want);
    }
    h.advance(Duration::from_secs(60));
    assert!(store
        .lease_tasks("webhook", "w", 1, LEASE)
        .await
        .unwrap()
        .is_empty());
    let dead = store
        .list_tasks("webhook", Some(TaskState::Dead))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, t.id);
    assert_eq!(dead[0].body, t.body, "a dead task keeps its body");
    assert_eq!(dead[0].last_error.as_deref(), Some("attempt 2 failed"));
    assert_eq!(store.task_counts("webhook").await.unwrap().dead, 1);
    assert!(store
        .list_tasks("webhook", Some(TaskState::Pending))
        .await
        .unwrap()
        .is_empty());

    let requeued = store.requeue_task(&t.id).await.unwrap();
    assert_eq!(requeued.state, TaskState::Pending);
    assert_eq!(requeued.attempts, 0);
    let err = store.requeue_task(&t.id).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::WrongState { .. })),
        "{err:?}"
    );
    let err = store
        .requeue_task(&oncely_store::TaskId("task_nope".into()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::NotFound(_))),
        "{err:?}"
    );
    let leased = store.lease_tasks("webhook", "w", 1, LEASE).await.unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].attempts, 1);

    // A worker that dies on the last attempt leaves a dead task, not an endless loop.
    let one = enqueue(&store, "once", 1).await;
    let leased = store.lease_tasks("webhook", "w", 10, LEASE).await.unwrap();
    assert!(leased.iter().any(|l| l.id == one.id));
    h.advance(LEASE + Duration::from_secs(1));
    let again = store.lease_tasks("webhook", "w2", 10, LEASE).await.unwrap();
    assert!(
        again.iter().all(|l| l.id != one.id),
        "not leased a second time"
    );
    let stored = store.get_task(&one.id).await.unwrap().unwrap();
    assert_eq!(stored.state, TaskState::Dead);
    assert_eq!(
        stored.last_error.as_deref(),
        Some(oncely_store::queue::LAPSED_ON_LAST_ATTEMPT)
    );
}

/// A capped lease never takes the running tasks of a kind over the cap, even when 20
/// capped leases race over two instances; finishing one frees one slot, and a running
/// task whose lease lapsed frees its slot (and is due again).
pub async fn queue_capped_leases_share_one_cap<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + TaskQueue,
{
    let a = h.store().await;
    let b = h.second().await;
    for i in 0..10 {
        enqueue(&a, &format!("cap{i}"), 5).await;
    }
    let mut joins = Vec::new();
    for i in 0..20 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        joins.push(tokio::spawn(async move {
            store
                .lease_tasks_capped("webhook", &format!("w{i}"), 3, LEASE)
                .await
                .unwrap()
        }));
    }
    let mut running = Vec::new();
    for j in joins {
        running.extend(j.await.unwrap());
    }
    assert_eq!(
        running.len(),
        3,
        "the cap holds across instances: {running:?}"
    );
    let ids: HashSet<_> = running.iter().map(|t| t.id.clone()).collect();
    assert_eq!(ids.len(), 3);
    assert!(b
        .lease_tasks_capped("webhook", "late", 3, LEASE)
        .await
        .unwrap()
        .is_empty());
    // Uncapped leases are not limited by it.
    assert_eq!(
        a.lease_tasks("webhook", "free", 2, LEASE)
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(a
        .lease_tasks_capped("webhook", "late", 5, LEASE)
        .await
        .unwrap()
        .is_empty());
    let done = running.pop().unwrap();
    a.finish_task(&done.fence().unwrap(), TaskOutcome::Done)
        .await
        .unwrap();
    let one = b
        .lease_tasks_capped("webhook", "next", 3, LEASE)
        .await
        .unwrap();
    assert!(one.is_empty(), "5 run under a cap of 3: {one:?}");
    let one = b
        .lease_tasks_capped("webhook", "next", 5, LEASE)
        .await
        .unwrap();
    assert_eq!(one.len(), 1, "one slot freed: {one:?}");
    // Every lease lapses: the running tasks are due again and hold no slot.
    h.advance(LEASE + Duration::from_secs(1));
    let again = a
        .lease_tasks_capped("webhook", "after", 4, LEASE)
        .await
        .unwrap();
    assert_eq!(again.len(), 4, "{again:?}");
    assert_eq!(
        a.task_counts("webhook").await.unwrap(),
        TaskCounts {
            pending: 0,
            running: 9,
            dead: 0
        },
        "the 4 pending tasks (due longest) were leased"
    );
}

/// A queued job's task (kind `job:...`) holding `body`.
fn job_task(body: &str) -> NewTask {
    NewTask {
        kind: "job:render".into(),
        target: "/v1/render".into(),
        method: "POST".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
        max_attempts: 1_000,
        timeout: Duration::from_secs(5),
        backoff: LEASE,
    }
}

fn job_spec(body: &str, owner: &str) -> ClaimSpec {
    spec("alice", "job-key", body, Class::Job, owner)
}

/// Leases the one due job task, checks that it belongs to `record`, and finishes it.
async fn run_job_task<S: TaskQueue + ?Sized>(store: &Arc<S>, record: &oncely_core::Record) {
    let leased = store
        .lease_tasks("job:render", "w", 10, LEASE)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "one job task is due: {leased:?}");
    assert_eq!(leased[0].record.as_ref(), Some(&record.id));
    let fence = leased[0].fence().unwrap();
    store.finish_task(&fence, TaskOutcome::Done).await.unwrap();
}

/// A failed (released) job is retried through the queue: the next identical
/// claim-with-task reclaims the record (same id, attempt + 1, so the same downstream key)
/// and queues its work again, once, even when 20 instances' claims race, replacing the
/// task its failed run's worker left unfinished; a different body under the key gets the
/// record, and a completed record past its window is renewed.
pub async fn queue_released_record_is_reclaimed_with_a_new_task<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + TaskQueue,
{
    let a = h.store().await;
    let b = h.second().await;
    let body = "{\"text\":\"hello\"}";
    let first = owned(
        a.claim_with_task(&[job_spec(body, "a")], None, job_task(body))
            .await
            .unwrap(),
    );
    // The worker records the release and stops before finishing its task.
    let leased = a.lease_tasks("job:render", "w", 10, LEASE).await.unwrap();
    assert_eq!(leased.len(), 1);
    let stale = leased[0].fence().unwrap();
    let released = a
        .release(&first.fence().unwrap(), Some("upstream 502".into()), WINDOW)
        .await
        .unwrap();
    assert_eq!(released.state, State::Released);
    assert_eq!(a.list_tasks("job:render", None).await.unwrap().len(), 1);

    // A different body under the released key is refused (the caller answers 422).
    let other = existing(
        a.claim_with_task(&[job_spec("{}", "x")], None, job_task("{}"))
            .await
            .unwrap(),
    );
    assert_eq!(other.id, first.id);
    assert_eq!(other.state, State::Released);
    assert_eq!(a.list_tasks("job:render", None).await.unwrap().len(), 1);

    // 20 identical retries over two instances: one reclaims, the rest get its record.
    let mut joins = Vec::new();
    for i in 0..20 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let owner = format!("retry-{i}");
        joins.push(tokio::spawn(async move {
            store
                .claim_with_task(&[job_spec(body, &owner)], None, job_task(body))
                .await
                .unwrap()
        }));
    }
    let mut reclaimed = Vec::new();
    for j in joins {
        match j.await.unwrap() {
            Claim::Owned(r) => reclaimed.push(r),
            Claim::Existing(r) => {
                assert_eq!(r.id, first.id);
                assert_eq!(r.state, State::Processing, "the retry's claim is seen");
            }
        }
    }
    assert_eq!(
        reclaimed.len(),
        1,
        "exactly one retry reclaims: {reclaimed:?}"
    );
    let again = reclaimed.pop().unwrap();
    assert_eq!(
        again.id, first.id,
        "the same record, so the same downstream key"
    );
    assert_eq!(again.attempt, 2);
    assert_eq!(again.state, State::Processing);
    assert_ne!(again.owner, first.owner);
    let tasks = a.list_tasks("job:render", None).await.unwrap();
    assert_eq!(tasks.len(), 1, "the retry is queued once: {tasks:?}");
    assert_eq!(tasks[0].record.as_ref(), Some(&first.id));
    assert_eq!(
        tasks[0].state,
        TaskState::Pending,
        "the new task, not the stale one"
    );
    assert_ne!(tasks[0].id, stale.id);
    let err = a.finish_task(&stale, TaskOutcome::Done).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { .. })),
        "{err:?}"
    );
    assert_eq!(tasks[0].body, body.as_bytes());
    assert_eq!(a.get(&first.id).await.unwrap().unwrap().attempt, 2);
    // The first run's fence is stale.
    let err = a
        .complete(&first.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Transition(TransitionError::Fenced { .. })),
        "{err:?}"
    );

    run_job_task(&b, &again).await;
    let done = b
        .complete(&again.fence().unwrap(), completion("{\"ok\":true}", 3))
        .await
        .unwrap();
    assert_eq!(done.state, State::Completed);
    // A completed job is replayed, not queued again.
    let replay = existing(
        b.claim_with_task(&[job_spec(body, "late")], None, job_task(body))
            .await
            .unwrap(),
    );
    assert_eq!(replay.id, first.id);
    assert_eq!(replay.state, State::Completed);
    assert!(a.list_tasks("job:render", None).await.unwrap().is_empty());

    // Past its window the key is a new intention: a new record and a new task.
    h.advance(WINDOW + Duration::from_secs(1));
    let renewed = owned(
        a.claim_with_task(&[job_spec(body, "next")], None, job_task(body))
            .await
            .unwrap(),
    );
    assert_ne!(renewed.id, first.id);
    assert_eq!(renewed.attempt, 1);
    assert_eq!(renewed.state, State::Processing);
    assert_eq!(
        a.get(&first.id).await.unwrap(),
        None,
        "the old row is replaced"
    );
    run_job_task(&a, &renewed).await;
}
