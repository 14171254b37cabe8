//! The claim loop as a job's request and the job worker carry it out: through the layer
//! and a running [`JobWorker`] on a memory store, [`Scripted`], that lets a test land
//! another party's move at a chosen point (a slow claim, a purge, a rival's take-over).
//! Time is paused: every wait is exact.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use oncely_core::{
    ClaimSpec, Class, Completion, Fence, Fingerprint, Identity, Record, RecordId, Resolution,
    Scope, State, StoredResponse, TakeOverOutcome, Timestamp,
};
use oncely_store::memory::MemoryStore;
use oncely_store::{
    Admin, Claim, Finished, Ledger, ListFilter, ManualClock, NewTask, PurgeStep, ReconcileSchedule,
    Repeat, RepeatEvents, StoreError, Task, TaskCounts, TaskFence, TaskId, TaskOutcome, TaskQueue,
    TaskState, Usage, UsageHour, Waiting,
};
use tower::{service_fn, Layer, ServiceExt};

use super::request::{task_kind, JobRequest};
use super::{JobWorker, JobWorkerOptions};
use crate::body::full;
use crate::{BoxBody, BoxError, Guard, IdempotencyLayer, RoutePolicy};

/// A memory store that passes every call through, except where a test armed a move of
/// another party's to land first.
#[derive(Debug)]
struct Scripted {
    inner: MemoryStore,
    clock: ManualClock,
    /// The next `claim_with_task` takes this long (a ledger slow to answer).
    slow_claim: Mutex<Option<Duration>>,
    /// The next wait that ends on a completed record finds it purged (its window ended).
    purge_after_wait: AtomicBool,
    /// The next take-over is raced by a rival worker, which takes the record over first
    /// and completes it.
    rival_takes_over: AtomicBool,
}

/// Passes the listed calls of a store trait through to `inner`, each after its `before`
/// step when it has one; `own` are the calls this store answers itself.
macro_rules! pass_through {
    ($trait:ident {
        $($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $(, before $before:ident($($b:ident),*))?;)*
    } $($own:tt)*) => {
        #[async_trait]
        impl $trait for Scripted {
            $(async fn $name(&self, $($arg: $ty),*) -> oncely_store::Result<$ret> {
                $(self.$before($($b),*).await?;)?
                self.inner.$name($($arg),*).await
            })*
            $($own)*
        }
    };
}

impl Scripted {
    /// A rival worker takes the record over first, and completes it.
    async fn rival_first(&self, id: &RecordId, attempt: u32) -> oncely_store::Result<()> {
        if self.rival_takes_over.swap(false, Ordering::SeqCst) {
            let lease = Duration::from_secs(1);
            let theirs = match self.inner.take_over(id, attempt, "rival/1", lease).await? {
                TakeOverOutcome::Owned(theirs) => theirs,
                other => panic!("the rival did not take {id} over: {other:?}"),
            };
            let done = completion("the rival's run");
            self.inner.complete(&theirs.fence().unwrap(), done).await?;
        }
        Ok(())
    }

    /// The claim is slow to land when a test said so.
    async fn slow_first(&self) -> oncely_store::Result<()> {
        let slow = self.slow_claim.lock().unwrap().take();
        if let Some(slow) = slow {
            tokio::time::sleep(slow).await;
        }
        Ok(())
    }
}

pass_through!(Ledger {
    claim(spec: &ClaimSpec) -> Claim;
    complete(fence: &Fence, completion: Completion) -> Record;
    release(fence: &Fence, error: Option<String>, window: Duration) -> Record;
    mark_unknown(fence: &Fence, error: String) -> Record;
    renew(fence: &Fence, lease: Duration) -> ();
    get(id: &RecordId) -> Option<Record>;
    lookup(scope: &Scope, key: &str) -> Option<Record>;
    resolve(id: &RecordId, resolution: Resolution) -> Record;
    record_repeats(id: &RecordId, principal: &str, route: &str, repeats: &[Repeat]) -> ();
    now() -> Timestamp;
    ping() -> ();
    take_over(id: &RecordId, expected_attempt: u32, owner: &str, lease: Duration) -> TakeOverOutcome,
        before rival_first(id, expected_attempt);
});

pass_through!(Waiting {}
    async fn wait_for(&self, id: &RecordId, timeout: Duration) -> oncely_store::Result<Record> {
        let purge = self.purge_after_wait.load(Ordering::SeqCst);
        let record = self.inner.wait_for(id, timeout).await?;
        if purge && record.state == State::Completed {
            self.purge_after_wait.store(false, Ordering::SeqCst);
            self.clock.advance(WINDOW * 2);
            self.inner.purge_expired().await?;
            assert!(self.inner.get(id).await?.is_none(), "{id} was not purged");
            return Err(StoreError::NotFound(id.clone()));
        }
        Ok(record)
    }
);

pass_through!(TaskQueue {
    lease_tasks(kind: &str, owner: &str, max: usize, lease: Duration) -> Vec<Task>;
    lease_tasks_capped(kind: &str, owner: &str, max_running: usize, lease: Duration) -> Vec<Task>;
    renew_task(fence: &TaskFence, lease: Duration) -> ();
    finish_task(fence: &TaskFence, outcome: TaskOutcome) -> Finished;
    get_task(id: &TaskId) -> Option<Task>;
    list_tasks(kind: &str, state: Option<TaskState>) -> Vec<Task>;
    requeue_task(id: &TaskId) -> Task;
    task_counts(kind: &str) -> TaskCounts;
    claim_with_task(specs: &[ClaimSpec], completion: Option<Completion>, task: NewTask) -> Claim,
        before slow_first();
});

pass_through!(Admin {
    list(filter: &ListFilter) -> Vec<Record>;
    purge_step() -> PurgeStep;
    purge_usage(before: Timestamp) -> u64;
    usage_by_hour(since: Option<Timestamp>) -> Vec<UsageHour>;
    repeat_events(principal: &str, since: Option<Timestamp>, limit: usize) -> RepeatEvents;
    usage(since: Option<Timestamp>) -> Usage;
    secret(name: &str) -> Vec<u8>;
    reconcile_schedule(id: &RecordId) -> Option<ReconcileSchedule>;
    schedule_reconcile(id: &RecordId, seen: ReconcileSchedule, next: ReconcileSchedule) -> bool;
});

const WINDOW: Duration = Duration::from_secs(60);
const ROUTE: &str = "POST /r";

fn completion(body: &'static str) -> Completion {
    Completion {
        response: StoredResponse {
            status: 200,
            headers: vec![],
            body: Some(Bytes::from_static(body.as_bytes())),
        },
        units: 0,
        window: WINDOW,
        replay_until: None,
        provider_request_id: None,
        trace: None,
    }
}

type Upstream = tower::util::BoxCloneService<Request<BoxBody>, Response<BoxBody>, BoxError>;

/// A job route `POST /r` (its `wait` 1 s) behind the layer, its worker running, over an
/// upstream that takes `takes` and answers `run N`.
struct Jobs {
    store: Arc<Scripted>,
    policy: Arc<RoutePolicy>,
    svc: crate::IdempotencyService<Upstream, Arc<dyn crate::RoutePolicies>>,
    runs: Arc<AtomicUsize>,
    _worker: JobWorker,
}

fn jobs(takes: Duration) -> Jobs {
    let clock = ManualClock::new();
    let store = Arc::new(Scripted {
        inner: MemoryStore::new(Arc::new(clock.clone())),
        clock,
        slow_claim: Mutex::default(),
        purge_after_wait: AtomicBool::default(),
        rival_takes_over: AtomicBool::default(),
    });
    let guard = Arc::new(Guard::new(store.clone(), b"test key".to_vec()));
    let mut policy = RoutePolicy::new(ROUTE, Class::Job);
    policy.wait = Duration::from_secs(1);
    policy.window = WINDOW;
    let policy = Arc::new(policy);
    let runs = Arc::new(AtomicUsize::new(0));
    let upstream = {
        let runs = runs.clone();
        Upstream::new(service_fn(move |_req: Request<BoxBody>| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                tokio::time::sleep(takes).await;
                Ok::<_, BoxError>(Response::new(full(format!("run {n}"))))
            }
        }))
    };
    let options = JobWorkerOptions {
        default_concurrency: 4,
        poll_interval: Duration::from_millis(50),
    };
    let worker = JobWorker::start(
        guard.clone(),
        vec![policy.clone()],
        upstream.clone(),
        options,
    );
    let routes: Arc<dyn crate::RoutePolicies> = {
        let policy = policy.clone();
        Arc::new(move |_: &Method, path: &str| (path == "/r").then(|| policy.clone()))
    };
    let svc = IdempotencyLayer::new(guard, routes).layer(upstream);
    Jobs {
        store,
        policy,
        svc,
        runs,
        _worker: worker,
    }
}

impl Jobs {
    /// The job request `POST /r` with key `k`, answered in full: status, `Oncely-Record`
    /// and body.
    async fn send(&self) -> (StatusCode, String, String) {
        let req = Request::post("/r")
            .header("authorization", "Bearer sk_alice")
            .header("idempotency-key", "k")
            .body(full("{}"))
            .unwrap();
        let res = self.svc.clone().oneshot(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let record = parts.headers.get("oncely-record");
        let record = record.map_or("", |v| v.to_str().unwrap()).to_owned();
        let text = String::from_utf8_lossy(&body).into_owned();
        (parts.status, record, text)
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

#[tokio::test(start_paused = true)]
async fn a_jobs_wait_is_counted_from_before_its_claim() {
    let jobs = jobs(Duration::from_secs(30));
    let (status, first, _) = jobs.send().await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // The duplicate's claim takes 1.5 s, more than its whole wait of 1 s: it is answered
    // as soon as its claim is, that the job still runs, and waits no longer.
    *jobs.store.slow_claim.lock().unwrap() = Some(Duration::from_millis(1500));
    let started = tokio::time::Instant::now();
    let (status, again, _) = jobs.send().await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(again, first, "the same job");
    assert!(
        took < Duration::from_millis(1600),
        "the duplicate was answered after {took:?}: its wait of 1 s counted from its claim's end"
    );
    assert_eq!(jobs.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_job_request_claims_again_when_its_record_is_purged_while_it_waits() {
    let jobs = jobs(Duration::from_millis(500));
    let first = jobs.send();
    let duplicate = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The duplicate waits on the running job; the job ends, and its record is purged
        // (its window over) before the duplicate reads it again.
        jobs.store.purge_after_wait.store(true, Ordering::SeqCst);
        jobs.send().await
    };
    let ((status, record, body), (again, reclaimed, again_body)) = tokio::join!(first, duplicate);
    assert_eq!((status, body.as_str()), (StatusCode::OK, "run 1"));
    // It claims again: a new record, its job run once more, its answer fresh.
    assert_eq!((again, again_body.as_str()), (StatusCode::OK, "run 2"));
    assert_ne!(reclaimed, record);
    let r = jobs.store.get(&RecordId(reclaimed)).await.unwrap().unwrap();
    assert_eq!(r.state, State::Completed);
    assert_eq!(jobs.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_worker_decides_again_when_a_rival_takes_its_record_over_first() {
    let jobs = jobs(Duration::ZERO);
    let kind = task_kind(ROUTE);
    // A job whose first worker died mid-run: its record still processing under that
    // worker's lapsed lease, its task leased once and lapsed too.
    let spec = ClaimSpec {
        identity: Identity::new(
            "p".into(),
            ROUTE.into(),
            Class::Job,
            Some("k".into()),
            Fingerprint([7; 32]),
            None,
        ),
        owner: "dead/1".into(),
        lease: Duration::from_secs(1),
    };
    let request = JobRequest {
        method: Method::POST,
        target: "/r".into(),
        headers: http::HeaderMap::new(),
        body: Bytes::new(),
    };
    // The worker is already polling: the task and its first lease land together.
    jobs.store.rival_takes_over.store(true, Ordering::SeqCst);
    let store = &jobs.store.inner;
    let Claim::Owned(record) = store
        .claim_with_task(&[spec], None, request.task(&jobs.policy, None))
        .await
        .unwrap()
    else {
        panic!("not claimed");
    };
    let leased = store
        .lease_tasks(&kind, "dead", 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    jobs.store.clock.advance(Duration::from_secs(5));
    // The worker leases the task again and takes the record over; a rival's take-over
    // and completion land first. The worker reads the record again, finds it ended and
    // drops its task, without running the job.
    for _ in 0..200 {
        if store.list_tasks(&kind, None).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        store.list_tasks(&kind, None).await.unwrap().is_empty(),
        "the task was kept: {:?}",
        store.list_tasks(&kind, None).await.unwrap()
    );
    assert!(
        !jobs.store.rival_takes_over.load(Ordering::SeqCst),
        "no take-over was tried"
    );
    let after = store.get(&record.id).await.unwrap().unwrap();
    assert_eq!(after.state, State::Completed);
    assert_eq!(after.attempt, record.attempt + 1, "the rival's attempt");
    assert_eq!(
        after.response.unwrap().body.as_deref(),
        Some(&b"the rival's run"[..])
    );
    assert_eq!(jobs.runs(), 0);
}
