//! The engine: [`Engine::execute`] claims a record through the claim loop (`claim`), and
//! either runs the upstream call as its owner on a task of its own, or answers from the
//! ledger (replay, join, refusal). What a claimant does with the record it found is
//! `oncely_core::decide`, carried out by the claim loop; this file claims a call's record
//! (on a task of its own, which starts the owner task) and turns the verdict into an
//! [`Execution`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use oncely_core::{ClaimSpec, DownstreamKey, Fence, Record};
use oncely_core::{Claimant, Refusal, Step as Decided};
use oncely_store::{churn, RepeatKind, Store, StoreError};
use tokio::sync::oneshot;

use crate::budget::Budget;
use crate::call::{Execution, FreshAnswer, GuardedCall, Head, UpstreamFailure, UpstreamFuture};
use crate::claim::{ClaimLoop, Claimed, Claimer, Claiming, Verdict};
use crate::delivery::{Delivery, Watch};
use crate::ledger;
use crate::owner;
use crate::tally::RepeatTally;
use crate::tasks::{TaskCount, TaskToken};
use crate::waits::Waits;

/// The engine: the ledger, the key principals are hashed with, this instance's owner id,
/// the count of owned upstream calls (for draining on shutdown), the repeats counted in
/// memory and the in-flight budget.
pub struct Engine {
    store: Arc<dyn Store>,
    principal_key: Vec<u8>,
    instance: String,
    next_owner: AtomicU64,
    tasks: TaskCount,
    pub(crate) repeats: Arc<RepeatTally>,
    budget: Arc<Budget>,
    waits: Waits,
    live: ledger::Live,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine on `store`, hashing principals with `principal_key` (HMAC-SHA256).
    pub fn new(store: Arc<dyn Store>, principal_key: Vec<u8>) -> Engine {
        let store_for_tally = store.clone();
        Engine {
            store,
            principal_key,
            instance: format!("inst_{}", uuid::Uuid::now_v7().simple()),
            next_owner: AtomicU64::new(1),
            tasks: TaskCount::default(),
            repeats: Arc::new(RepeatTally::new(store_for_tally)),
            budget: Budget::new(DEFAULT_MAX_INFLIGHT_BYTES),
            waits: Waits::default(),
            live: ledger::Live::default(),
        }
    }

    /// Bounds what answers in flight may hold in memory, over every route: what owners
    /// keep of the answers they record and what their callers have not read yet (default
    /// [`DEFAULT_MAX_INFLIGHT_BYTES`]). See the `budget` module.
    pub fn with_max_inflight_bytes(mut self, bytes: u64) -> Engine {
        self.budget = Budget::new(bytes);
        self
    }

    /// The ledger.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// This instance's id (owners are `INSTANCE/N`).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The keyed hash a raw principal is stored as: HMAC-SHA256 in lower-case hex. The
    /// CLI uses it to filter the ledger by a principal's raw value.
    pub fn principal_hash(&self, raw: &[u8]) -> String {
        oncely_core::principal_hash(&self.principal_key, raw)
    }

    /// Owned upstream calls (and their ledger writes) running now.
    pub fn in_flight(&self) -> usize {
        self.tasks.current()
    }

    /// Counts a background task (a job run) until the token is dropped: [`Engine::drain`]
    /// waits for it.
    pub fn start_task(&self) -> TaskToken {
        self.tasks.start()
    }

    /// Waits until every owned upstream call has finished and been recorded, and every
    /// repeat has been counted. The binary calls it on shutdown after it stops accepting.
    pub async fn drain(&self) {
        self.tasks.wait_idle().await;
        self.flush_repeats().await;
    }

    /// Writes the repeats counted in memory so far to the ledger (one `record_repeats` per
    /// record), and returns once they are written. A background task does this every
    /// [`REPEAT_FLUSH`](crate::REPEAT_FLUSH); [`Engine::drain`] does it last.
    pub async fn flush_repeats(&self) {
        self.repeats.flush().await
    }

    /// A new owner id of this instance (`INSTANCE/N`).
    pub fn new_owner(&self) -> String {
        format!(
            "{}/{}",
            self.instance,
            self.next_owner.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// What claiming `call` asks of the ledger, with a new owner id of this instance.
    pub fn claim_spec(&self, call: &GuardedCall) -> ClaimSpec {
        ClaimSpec {
            identity: call.identity.clone(),
            owner: self.new_owner(),
            lease: call.lease,
        }
    }

    /// Runs the owner task of a record this instance already owns (a queued job's run)
    /// on the current task, to its end: the upstream call, lease renewal, the streaming
    /// tee into `head`'s body and the fenced completion. Counted by [`Engine::drain`].
    pub async fn run_owned<H: Send + 'static>(
        &self,
        record: Record,
        fence: Fence,
        call: GuardedCall,
        upstream: UpstreamFuture<H>,
        head: oneshot::Sender<Head<H>>,
    ) {
        owner::run(owner::OwnerTask {
            store: self.store.clone(),
            record,
            call,
            upstream,
            head,
            token: self.tasks.start(),
            budget: self.budget.clone(),
            held: self.live.hold(&fence.owner),
            fence,
        })
        .await
    }

    /// Claims the call's record and executes it once: as its owner (running `run` on a
    /// task the caller does not own, with the downstream key and the record as claimed:
    /// its attempt, and what an earlier attempt left in it), or from the ledger (replay,
    /// join, refusal). `run` is called at most once.
    pub async fn execute<H, F>(&self, call: GuardedCall, run: F) -> Execution<FreshAnswer<H>>
    where
        H: Send + 'static,
        F: FnOnce(DownstreamKey, &Record) -> UpstreamFuture<H> + Send + 'static,
    {
        let claiming = Claiming {
            claimant: Claimant::Call,
            fingerprint: Some(call.fingerprint),
            deadline: tokio::time::Instant::now() + call.wait,
            now: None,
        };
        // Armed from before the claim: dropped undone (this future dropped, its caller gone,
        // even while the claim is on its way), the record this call owns is undelivered.
        let watch = call
            .churn
            .as_ref()
            .map(|c| Watch::new(self.store.clone(), &call, c.churn));
        let delivery = watch.clone().map(Delivery::owner);
        let mut claimer = CallClaimer {
            engine: self,
            spec: self.claim_spec(&call),
            call: &call,
            run: Some(Box::new(run)),
            watch,
        };
        match self.claim(&mut claimer, claiming).await {
            Verdict::Owned((record, head)) => owner_answer(record, head, delivery).await,
            verdict => {
                // Not this call's record: what its caller does is nothing to the ledger.
                if let Some(d) = delivery {
                    d.unowned();
                }
                self.answer(verdict, call.wait)
            }
        }
    }

    /// The claim loop (see the `claim` module): claims with `claimer`, and carries out
    /// what `oncely_core::decide` says until a step ends it. The engine's calls, a job's
    /// submission, the job worker and the gateway's sweep all claim through it.
    pub async fn claim<C: Claimer>(
        &self,
        claimer: &mut C,
        claiming: Claiming,
    ) -> Verdict<C::Owned> {
        ClaimLoop {
            store: &self.store,
            live: &self.live,
            waits: &self.waits,
        }
        .run(claimer, claiming)
        .await
    }

    /// The answer from the ledger of a call's (or a job request's) claim that does not
    /// own the record: a replay or a join (counted), a refusal, in flight (with a retry
    /// after [`retry_after`]`(wait)`), the ledger unavailable. A job's request answers a
    /// failed job and one still running itself; a claim that owns is executed, not
    /// answered.
    pub fn answer<O, F>(&self, verdict: Verdict<O>, wait: Duration) -> Execution<F> {
        match verdict {
            Verdict::Owned(_) => unreachable!("a claim that owns is executed, not answered"),
            Verdict::Decided {
                step: step @ (Decided::Replay | Decided::Join | Decided::Refuse(Refusal::TooLarge)),
                record,
                waited,
            } => self.answer_completed(record, waited, step),
            Verdict::Decided {
                step: Decided::Refuse(Refusal::KeyReused),
                record,
                ..
            } => Execution::KeyReused(record),
            Verdict::Decided {
                step: Decided::Refuse(Refusal::OutcomeUnknown),
                record,
                ..
            }
            | Verdict::Unknown(record) => Execution::OutcomeUnknown(record),
            Verdict::Decided {
                step: Decided::Refuse(Refusal::StillRunning),
                record,
                ..
            }
            | Verdict::LeaseHeld(record) => Execution::InFlight {
                record,
                retry_after: retry_after(wait),
            },
            Verdict::Unavailable(e) => Execution::StoreUnavailable(e.to_string()),
            Verdict::Gone => Execution::StoreUnavailable("the record is gone".into()),
            Verdict::Decided { step, .. } => unreachable!("a call is never told {step:?}"),
        }
    }

    /// A completed record: replay or join it, or refuse it as too large (the `step`
    /// `oncely_core::decide` gave), and count the repeat off the answer's path.
    fn answer_completed<F>(&self, record: Record, waited: bool, step: Decided) -> Execution<F> {
        let kind = if waited {
            RepeatKind::Joined
        } else {
            RepeatKind::Replayed
        };
        self.count_repeat(&record, kind);
        match step {
            Decided::Replay => Execution::Replayed(record),
            Decided::Join => Execution::Joined(record),
            _ => Execution::TooLarge(record),
        }
    }

    fn count_repeat(&self, record: &Record, kind: RepeatKind) {
        self.repeats.add(record, kind, record.units);
    }

    /// Runs `op` (a claim, or a take-over of a lapsed lease) and, when it makes this call
    /// the owner, starts the owner task with `run`, all on a task the caller does not
    /// own: a caller that goes away between a committed claim and the owner's start
    /// would otherwise leave the record processing with nobody running it. Jobs do not
    /// come here: their calls are queued durably with their claim and run by the
    /// protocol layer's job worker (through [`Engine::run_owned`]).
    async fn claim_detached<H, F>(
        &self,
        call: &GuardedCall,
        run: F,
        op: BoxFuture<'static, Result<Claimed<Record>, StoreError>>,
        watch: Option<Arc<Watch>>,
    ) -> Detached<H, F>
    where
        H: Send + 'static,
        F: FnOnce(DownstreamKey, &Record) -> UpstreamFuture<H> + Send + 'static,
    {
        // Counted from before the claim, so that a drain waits for a claim in flight.
        let token = self.tasks.start();
        let store = self.store.clone();
        let budget = self.budget.clone();
        let live = self.live.clone();
        let call = call.clone();
        let task = tokio::spawn(async move {
            // The store bounds the claim, and releases one that lands after it, unsent.
            let unowned = || {
                if let Some(watch) = &watch {
                    watch.unowned();
                }
            };
            let record = match op.await {
                Ok(Claimed::Owned(record)) => record,
                Ok(Claimed::Found(record)) => {
                    unowned();
                    return Detached::Other(Claimed::Found(record), run);
                }
                Ok(Claimed::Unknown(record)) => {
                    unowned();
                    return Detached::Other(Claimed::Unknown(record), run);
                }
                Ok(Claimed::Gone) => {
                    unowned();
                    return Detached::Other(Claimed::Gone, run);
                }
                Err(e) => {
                    unowned();
                    return Detached::Failed(e, run);
                }
            };
            let Some(fence) = record.fence() else {
                return Detached::Broken(format!("owned record {} has no owner", record.id));
            };
            if let Some(watch) = &watch {
                watch.owned(&record);
            }
            let held = live.hold(&fence.owner);
            // The record's key, not the call's: a made-up key that runs its original (a
            // take-over, a released record claimed again) sends the original's.
            let upstream = run(DownstreamKey::derive(&record.scope, &record.key), &record);
            let (head_tx, head_rx) = oneshot::channel();
            tokio::spawn(owner::run(owner::OwnerTask {
                store,
                record: record.clone(),
                fence,
                call,
                upstream,
                head: head_tx,
                token,
                budget,
                held,
            }));
            Detached::Owner(record, head_rx)
        });
        match task.await {
            Ok(d) => d,
            Err(e) => Detached::Broken(format!("the claim task ended: {e}")),
        }
    }
}

/// A guarded call's claimer: claims and takes over on a task of its own
/// ([`Engine::claim_detached`]), which starts the owner task when it wins.
struct CallClaimer<'a, H> {
    engine: &'a Engine,
    call: &'a GuardedCall,
    spec: ClaimSpec,
    /// The upstream call, given back by every claim that did not own.
    run: Option<RunUpstream<H>>,
    /// What became of the call's caller (a route that recognises made-up keys).
    watch: Option<Arc<Watch>>,
}

/// The upstream call a call's owner runs (boxed: the claim loop is generic over the
/// claimer, and a closure type with a higher-ranked bound defeats the proof that its
/// future is `Send`).
type RunUpstream<H> = Box<dyn FnOnce(DownstreamKey, &Record) -> UpstreamFuture<H> + Send>;

impl<H: Send + 'static> CallClaimer<'_, H> {
    async fn detached(
        &mut self,
        op: BoxFuture<'static, Result<Claimed<Record>, StoreError>>,
    ) -> Result<Claimed<Owning<H>>, StoreError> {
        let run = self.run.take().expect("run is given back unless owned");
        let watch = self.watch.clone();
        match self.engine.claim_detached(self.call, run, op, watch).await {
            Detached::Owner(record, head) => Ok(Claimed::Owned((record, head))),
            Detached::Other(claimed, run) => {
                self.run = Some(run);
                Ok(claimed)
            }
            Detached::Failed(e, run) => {
                self.run = Some(run);
                Err(e)
            }
            Detached::Broken(why) => Err(StoreError::Unavailable(why)),
        }
    }
}

/// A call that owns its record: the record as claimed, and its owner task's head.
type Owning<H> = (Record, oneshot::Receiver<Head<H>>);

impl<H: Send + 'static> Claimer for CallClaimer<'_, H> {
    type Owned = Owning<H>;

    fn claim(&mut self) -> BoxFuture<'_, Result<Claimed<Owning<H>>, StoreError>> {
        let store = self.engine.store.clone();
        let spec = self.spec.clone();
        let Some(c) = self.call.churn.clone() else {
            let op = async move { store.claim(&spec).await.map(Claimed::from) };
            return Box::pin(self.detached(op.boxed()));
        };
        let route = self.call.route.clone();
        let watch = self.watch.clone();
        let op = async move {
            let gone = || watch.as_ref().is_some_and(|w| w.is_gone());
            let (claim, joined) = churn::claim(&*store, &spec, c.churn, &gone).await?;
            if joined {
                c.joined.store(true, Ordering::Relaxed);
                metrics::counter!("oncely_key_churn_total", "route" => route).increment(1);
            }
            Ok(Claimed::from(claim))
        };
        Box::pin(self.detached(op.boxed()))
    }

    fn take_over<'a>(
        &'a mut self,
        found: &'a Record,
    ) -> BoxFuture<'a, Result<Claimed<Owning<H>>, StoreError>> {
        let store = self.engine.store.clone();
        let (id, attempt) = (found.id.clone(), found.attempt);
        let (owner, lease) = (self.spec.owner.clone(), self.call.lease);
        let op = async move {
            store
                .take_over(&id, attempt, &owner, lease)
                .await
                .map(Claimed::from)
        };
        Box::pin(self.detached(op.boxed()))
    }
}

/// The answer of a call this request owns: the owner task's head (or its failure).
async fn owner_answer<H>(
    record: Record,
    head: oneshot::Receiver<Head<H>>,
    delivery: Option<Delivery>,
) -> Execution<FreshAnswer<H>> {
    match head.await {
        Ok(Head::Answer {
            status,
            head,
            mut body,
        }) => {
            if let Some(d) = delivery {
                body.deliver(d);
            }
            Execution::Fresh(FreshAnswer {
                record,
                status,
                head,
                body,
            })
        }
        Ok(head) => {
            let execution = head.into_execution(record);
            if let (Some(d), Execution::UpstreamFailed { record, .. }) = (delivery, &execution) {
                d.settled(record);
            }
            execution
        }
        // The owner task panicked: the record stays processing until its lease lapses.
        Err(_) => Execution::UpstreamFailed {
            record,
            failure: UpstreamFailure::Lost("the owner task ended without an answer".into()),
        },
    }
}

/// The default bound of what answers in flight may hold in memory (512 MiB).
pub const DEFAULT_MAX_INFLIGHT_BYTES: u64 = 512 << 20;

/// A claim run on a task of its own, with `run` given back when it did not own.
enum Detached<H, F> {
    /// Owned, and the owner task runs: its head comes through the receiver.
    Owner(Record, oneshot::Receiver<Head<H>>),
    /// Not owned: what the claim found.
    Other(Claimed<Owning<H>>, F),
    /// The store failed.
    Failed(StoreError, F),
    /// Owned, but the record came back without an owner (a store bug), or the task died.
    Broken(String),
}

/// When a duplicate refused with `in_flight` should ask again: half the route's `wait`,
/// between 1 and 60 seconds.
pub fn retry_after(wait: Duration) -> Duration {
    (wait / 2).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{Classified, Classifier, UpstreamAnswer};
    use crate::stream::{BodyStream, CallerBody};
    use futures::{FutureExt, StreamExt};
    use oncely_core::{Class, Identity, StoredResponse};
    use std::sync::atomic::AtomicBool;

    use crate::REPEAT_FLUSH;
    use oncely_core::{Fingerprint, State};

    fn one_chunk(body: &'static str) -> BodyStream {
        futures::stream::iter([Ok(bytes::Bytes::from_static(body.as_bytes()))]).boxed()
    }

    async fn read(body: CallerBody) -> Vec<u8> {
        let chunks: Vec<bytes::Bytes> = body.map(|c| c.unwrap()).collect().await;
        chunks.concat()
    }

    fn call(key: &str) -> GuardedCall {
        GuardedCall {
            identity: Identity::new(
                "p".into(),
                "/mcp#render".into(),
                Class::Write,
                Some(key.to_string()),
                Fingerprint([7; 32]),
                None,
            ),
            window: Duration::from_secs(60),
            wait: Duration::from_secs(1),
            lease: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
            max_response: 1024,
            units: 3,
            answer_before_record: false,
            slots: None,
            trace: None,
            churn: None,
        }
    }

    #[tokio::test]
    async fn the_owner_holds_a_slot_and_a_call_that_finds_none_is_never_sent() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let guard = Engine::new(store.clone(), b"k".to_vec());
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let upstream = |sent: Arc<std::sync::atomic::AtomicUsize>,
                        slots: Arc<tokio::sync::Semaphore>| {
            move |_: DownstreamKey, _: &Record| {
                async move {
                    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    // The owner holds the route's one slot while its call runs.
                    assert_eq!(slots.available_permits(), 0);
                    Ok(UpstreamAnswer::new(200, (), one_chunk("done")))
                }
                .boxed()
            }
        };
        let mut first = call("first");
        first.slots = Some(slots.clone());
        match guard
            .execute(first, upstream(sent.clone(), slots.clone()))
            .await
        {
            Execution::Fresh(f) => assert_eq!(read(f.body).await, b"done"),
            other => panic!("expected a fresh answer, got {other:?}"),
        }
        assert_eq!(
            slots.available_permits(),
            1,
            "the slot is free once the answer is read"
        );

        // Every slot taken for all of `timeout`: released, never sent, told busy.
        let held = slots.clone().acquire_owned().await.unwrap();
        let mut second = call("second");
        second.slots = Some(slots.clone());
        second.timeout = Duration::from_millis(100);
        match guard
            .execute(second, upstream(sent.clone(), slots.clone()))
            .await
        {
            Execution::UpstreamFailed { record, failure } => {
                assert_eq!(failure, UpstreamFailure::Busy);
                assert_eq!(record.state, oncely_core::State::Released);
            }
            other => panic!("expected busy, got {other:?}"),
        }
        drop(held);
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    async fn run_with(guard: &Engine, key: &str, body: &'static str, classify: Classifier) {
        let execution = guard
            .execute(call(key), move |_, _| {
                async move {
                    let mut answer = UpstreamAnswer::new(200, (), one_chunk(body));
                    answer.classify = Some(classify);
                    Ok(answer)
                }
                .boxed()
            })
            .await;
        let Execution::Fresh(fresh) = execution else {
            panic!("expected a fresh execution, got {execution:?}");
        };
        // The caller still gets what the upstream sent, byte for byte.
        let seen = read(fresh.body).await;
        assert_eq!(seen, body.as_bytes());
        guard.drain().await;
    }

    #[tokio::test]
    async fn a_classifier_decides_what_is_stored_or_released() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let guard = Engine::new(store.clone(), b"k".to_vec());

        // Store: the classifier's response is kept, not the upstream's bytes.
        run_with(
            &guard,
            "stored",
            "event: message\ndata: {\"result\":1}\n\n",
            Box::new(|body| {
                assert!(body.starts_with(b"event: message"));
                Classified::Store(StoredResponse {
                    status: 200,
                    headers: vec![("content-type".into(), "application/json".into())],
                    body: Some(bytes::Bytes::from_static(b"{\"result\":1}")),
                })
            }),
        )
        .await;
        match guard
            .execute::<(), _>(call("stored"), |_, _| {
                panic!("a stored answer must not run again")
            })
            .await
        {
            Execution::Replayed(record) => {
                let response = record.response.unwrap();
                assert_eq!(response.body.as_deref(), Some(&b"{\"result\":1}"[..]));
                assert_eq!(record.units, 3);
            }
            other => panic!("expected a replay, got {other:?}"),
        }

        // Release: nothing is stored and the next identical call executes again.
        run_with(
            &guard,
            "released",
            "{\"error\":{\"code\":-32000}}",
            Box::new(|_| Classified::Release("a JSON-RPC error".into())),
        )
        .await;
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let again = guard
            .execute(call("released"), move |_, _| {
                flag.store(true, Ordering::SeqCst);
                async { Ok(UpstreamAnswer::new(200, (), one_chunk("ok"))) }.boxed()
            })
            .await;
        assert!(matches!(again, Execution::Fresh(_)));
        assert!(ran.load(Ordering::SeqCst), "a released call executes again");
        let record = match again {
            Execution::Fresh(f) => f.record,
            _ => unreachable!(),
        };
        assert_eq!(record.attempt, 2);
        guard.drain().await;
        let record = store.get(&record.id).await.unwrap().unwrap();
        assert_eq!(record.state, State::Completed);
    }

    #[tokio::test]
    async fn a_classifier_is_not_called_for_an_answer_too_large_to_keep() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let guard = Engine::new(store.clone(), b"k".to_vec());
        let big: &'static str = Box::leak("x".repeat(2048).into_boxed_str());
        run_with(
            &guard,
            "big",
            big,
            Box::new(|_| panic!("not called when the body was not kept")),
        )
        .await;
        assert!(matches!(
            guard
                .execute::<(), _>(call("big"), |_, _| panic!("no second run"))
                .await,
            Execution::TooLarge(_)
        ));
    }

    async fn completed(guard: &Engine, key: &str) -> Record {
        let execution = guard
            .execute(call(key), |_, _| {
                async { Ok(UpstreamAnswer::new(200, (), one_chunk("done"))) }.boxed()
            })
            .await;
        let Execution::Fresh(fresh) = execution else {
            panic!("expected a fresh execution, got {execution:?}");
        };
        read(fresh.body).await;
        guard.drain().await;
        fresh.record
    }

    async fn replay_n(guard: &Engine, key: &str, n: usize) {
        for _ in 0..n {
            match guard
                .execute::<(), _>(call(key), |_, _| panic!("no second run"))
                .await
            {
                Execution::Replayed(_) => {}
                other => panic!("expected a replay, got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn replays_are_counted_in_memory_and_written_in_one_sum_per_record() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let guard = Engine::new(store.clone(), b"k".to_vec());
        let a = completed(&guard, "a").await;
        let b = completed(&guard, "b").await;
        replay_n(&guard, "a", 37).await;
        replay_n(&guard, "b", 5).await;
        guard.flush_repeats().await;
        let a = store.get(&a.id).await.unwrap().unwrap();
        let b = store.get(&b.id).await.unwrap().unwrap();
        assert_eq!((a.repeats, a.repeat_units), (37, 37 * 3));
        assert_eq!((b.repeats, b.repeat_units), (5, 5 * 3));
        // A second flush with nothing new adds nothing.
        guard.flush_repeats().await;
        let a = store.get(&a.id).await.unwrap().unwrap();
        assert_eq!(a.repeats, 37);
    }

    #[tokio::test]
    async fn each_repeat_is_kept_with_its_kind_and_over_the_cap_summed() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let mut guard = Engine::new(store.clone(), b"k".to_vec());
        let tally = Arc::get_mut(&mut guard.repeats).unwrap();
        tally.max_events = 3;
        // No background flush: on a busy machine its tick fell between the replays and
        // lifted the cap this test is about. The test flushes itself.
        tally.flusher = AtomicBool::new(true);
        let a = completed(&guard, "a").await;
        replay_n(&guard, "a", 5).await;
        guard.flush_repeats().await;
        let record = store.get(&a.id).await.unwrap().unwrap();
        assert_eq!(
            (record.repeats, record.repeat_units),
            (5, 15),
            "all counted"
        );
        let events = store.repeat_events(&a.principal, None, 100).await.unwrap();
        assert_eq!((events.total, events.total_units), (5, 15), "all kept");
        let counts: Vec<u64> = events.listed.iter().map(|e| e.count).collect();
        assert_eq!(counts, [1, 1, 1, 2], "three one by one, two summed");
        assert!(events
            .listed
            .iter()
            .all(|e| e.kind == RepeatKind::Replayed && e.units == 3 * e.count && e.record == a.id));
        // The cap is on what waits: after a flush, the next repeats are kept again.
        replay_n(&guard, "a", 2).await;
        guard.flush_repeats().await;
        let events = store.repeat_events(&a.principal, None, 100).await.unwrap();
        assert_eq!((events.total, events.listed.len()), (7, 6));
    }

    #[tokio::test]
    async fn drain_writes_every_counted_repeat() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let guard = Engine::new(store.clone(), b"k".to_vec());
        let a = completed(&guard, "a").await;
        replay_n(&guard, "a", 12).await;
        guard.drain().await;
        let a = store.get(&a.id).await.unwrap().unwrap();
        assert_eq!((a.repeats, a.repeat_units), (12, 36));
    }

    #[tokio::test]
    async fn the_background_task_writes_repeats_without_a_drain() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let guard = Engine::new(store.clone(), b"k".to_vec());
        let a = completed(&guard, "a").await;
        replay_n(&guard, "a", 4).await;
        let deadline = tokio::time::Instant::now() + REPEAT_FLUSH * 10;
        loop {
            let r = store.get(&a.id).await.unwrap().unwrap();
            if r.repeats == 4 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "repeats not written within {:?}: {}",
                REPEAT_FLUSH * 10,
                r.repeats
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
