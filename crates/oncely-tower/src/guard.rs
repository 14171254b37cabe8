//! The guard engine: one mechanism, protocol-agnostic, that the HTTP layer (and later the
//! MCP mode) translates from and to. [`Guard::execute`] claims a record, and either runs
//! the upstream call as its owner on a task of its own, or answers from the ledger
//! (replay, join, refusal).
//!
//! Repeats (replays and joins) are counted in memory per record and written to the ledger
//! in sums, one `add_repeats` per record every [`REPEAT_FLUSH`] and on [`Guard::drain`],
//! so that a replay never waits on, nor queues behind, a ledger write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use hmac::{Hmac, Mac};
use http::{HeaderMap, StatusCode};
use oncely_core::{decide, Claimant, Refusal, Seen, Step as Decided};
use oncely_core::{
    ClaimSpec, Class, DownstreamKey, Fingerprint, Record, RecordId, Scope, StoredResponse,
    TakeOverOutcome,
};
use oncely_store::{Claim, Repeat, RepeatKind, Store, StoreError};
use sha2::Sha256;
use tokio::sync::{oneshot, watch};

use crate::budget::Budget;
use crate::owner;
use crate::BoxBody;

/// An upstream failure the inner service reports. The gateway's proxy maps its client
/// errors to these and returns them boxed as its service error; any other error is taken
/// as [`UpstreamError::AfterSend`], because it may hide an effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// Nothing reached the upstream (connection refused, DNS, TLS handshake).
    #[error("upstream unreachable: {0}")]
    BeforeSend(String),
    /// The request was (or may have been) sent, then the exchange broke off.
    #[error("upstream failed after the request was sent: {0}")]
    AfterSend(String),
}

/// The upstream's answer, as the `run` closure of [`Guard::execute`] returns it.
pub struct UpstreamAnswer {
    /// Status.
    pub status: StatusCode,
    /// Headers, as the upstream sent them.
    pub headers: HeaderMap,
    /// The body; the owner task streams it to the caller while it records it.
    pub body: BoxBody,
    /// Billing units the answer itself names (`units = response_header:NAME`); `None`
    /// keeps [`GuardedCall::units`].
    pub units: Option<u64>,
    /// Decides what is stored once the whole body has been read; `None` stores the answer
    /// as it came. See [`Classifier`].
    pub classify: Option<Classifier>,
}

impl UpstreamAnswer {
    /// An answer stored as it comes (no units of its own, no classifier).
    pub fn new(status: StatusCode, headers: HeaderMap, body: BoxBody) -> UpstreamAnswer {
        UpstreamAnswer {
            status,
            headers,
            body,
            units: None,
            classify: None,
        }
    }

    /// Sets the units the answer names.
    pub fn with_units(mut self, units: Option<u64>) -> UpstreamAnswer {
        self.units = units;
        self
    }

    /// Sets the classifier that decides what is stored.
    pub fn with_classifier(mut self, classify: Classifier) -> UpstreamAnswer {
        self.classify = Some(classify);
        self
    }
}

impl std::fmt::Debug for UpstreamAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamAnswer")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("units", &self.units)
            .field("classify", &self.classify.is_some())
            .finish_non_exhaustive()
    }
}

/// What a [`Classifier`] decided about a whole answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// Store this response (it may differ from what the upstream sent, e.g. the one
    /// JSON-RPC result out of an event stream). Its `body: None` stores the answer as too
    /// large to keep.
    Store(StoredResponse),
    /// Store nothing: release the record with this reason, so a repeat executes again
    /// (e.g. a JSON-RPC error inside an HTTP 200).
    Release(String),
    /// Store nothing and mark the record `outcome_unknown` with this reason, whatever the
    /// class: the call was sent and may have taken effect, but the answer does not say
    /// (e.g. an MCP event stream that ended without the call's response). Duplicates are
    /// refused until the record is reconciled.
    Unknown(String),
}

/// Reads an answer's status, headers and whole body after the owner task has streamed
/// it, and decides what the ledger keeps. Called at most once, and only when the class
/// would store the answer and its body was kept (not over `max_response`); otherwise it
/// is dropped uncalled (when the owner task ends).
pub type Classifier = Box<dyn FnOnce(StatusCode, &HeaderMap, &[u8]) -> Classified + Send>;

/// One guarded call, protocol-agnostic: who, what, and the route's timings.
#[derive(Debug, Clone)]
pub struct GuardedCall {
    /// Hash of principal + route ([`Scope::new`]).
    pub scope: Scope,
    /// The client's key, or the fingerprint hex.
    pub key: String,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The operation class (`write`, `action` or `job`; `read` is never guarded).
    pub class: Class,
    /// The route's name, as the ledger shows it.
    pub route: String,
    /// The principal's keyed hash ([`Guard::principal_hash`]).
    pub principal: String,
    /// How long a completed result is replayed.
    pub window: Duration,
    /// How long a duplicate waits for an in-flight original.
    pub wait: Duration,
    /// The owner's lease, renewed every third of it while the call runs.
    pub lease: Duration,
    /// Upstream timeout: head and body.
    pub timeout: Duration,
    /// Answers larger than this reach their caller but are stored without a body.
    pub max_response: u64,
    /// The caller's workflow id (`X-Workflow-Id` or the `traceparent` trace id).
    pub workflow_id: Option<String>,
    /// Billing units of one execution, as known from the request.
    pub units: u64,
    /// End the caller's body before the completion is durable (the route's `answer =
    /// "before_record"`); by default it ends after.
    pub answer_before_record: bool,
}

/// The answer of a call this request owned and executed now.
pub struct FreshAnswer {
    /// The record as claimed (processing): its id and attempt. It is completed (or
    /// released) by the owner task once the body has been read; the body ends after
    /// that write.
    pub record: Record,
    /// The upstream's status.
    pub status: StatusCode,
    /// The upstream's headers.
    pub headers: HeaderMap,
    /// The upstream's body, streamed.
    pub body: BoxBody,
}

impl std::fmt::Debug for FreshAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshAnswer")
            .field("record", &self.record.id)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// How an owned upstream call failed without an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// Nothing reached the upstream: the record was released.
    Unreachable(String),
    /// The exchange broke off after the request was sent: released (write, job) or
    /// outcome_unknown (action).
    Lost(String),
    /// No answer within `timeout`: released (write, job) or outcome_unknown (action).
    Timeout,
    /// The call waited for one of its route's upstream slots (`concurrency`) for all of
    /// `timeout` and was never sent: the record was released.
    Busy,
}

/// What [`Guard::execute`] did. The HTTP layer is a thin translation of this.
#[derive(Debug)]
#[non_exhaustive]
pub enum Execution {
    /// This call owned the record and executed upstream now.
    Fresh(FreshAnswer),
    /// A completed record's stored answer (its `response` has a body).
    Replayed(Record),
    /// This call waited for an identical one in flight and got its stored answer.
    Joined(Record),
    /// The original still runs after `wait`.
    InFlight {
        /// The processing record.
        record: Record,
        /// When to ask again.
        retry_after: Duration,
    },
    /// The record awaits reconciliation.
    OutcomeUnknown(Record),
    /// The original completed, but its answer was over `max_response` and not kept.
    TooLarge(Record),
    /// The same key was used with a different fingerprint.
    KeyReused(Record),
    /// The ledger cannot be reached: nothing was forwarded. The text is for the log only.
    StoreUnavailable(String),
    /// This call owned the record and the upstream failed without an answer; the record
    /// is as the failure left it.
    UpstreamFailed {
        /// The record after the failure was written (released or outcome_unknown).
        record: Record,
        /// What happened.
        failure: UpstreamFailure,
    },
    /// A job still runs after `wait` (its first request, or a duplicate): answered 202
    /// with the job's id. See [`crate::jobs`].
    Accepted {
        /// The processing record (its id is the job id).
        record: Record,
        /// Whether this request started the job (else it joined a running one).
        first: bool,
        /// When to ask again.
        retry_after: Duration,
    },
}

/// The guard: the ledger, the key principals are hashed with, this instance's owner id,
/// and the count of owned upstream calls (for draining on shutdown).
pub struct Guard {
    pub(crate) store: Arc<dyn Store>,
    principal_key: Vec<u8>,
    instance: String,
    next_owner: AtomicU64,
    pub(crate) tasks: TaskCount,
    pub(crate) jobs: crate::jobs::JobBoard,
    repeats: Arc<RepeatTally>,
    pub(crate) budget: Arc<Budget>,
    waits: Mutex<HashMap<RecordId, SharedWait>>,
    pub(crate) job_key: Option<crate::seal::JobKey>,
    tracer: Option<Arc<crate::trace::Tracer>>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("store", &self.store)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// A guard on `store`, hashing principals with `principal_key` (HMAC-SHA256).
    pub fn new(store: Arc<dyn Store>, principal_key: Vec<u8>) -> Guard {
        let store_for_tally = store.clone();
        Guard {
            store,
            principal_key,
            instance: format!("inst_{}", uuid::Uuid::now_v7().simple()),
            next_owner: AtomicU64::new(1),
            tasks: TaskCount::default(),
            jobs: crate::jobs::JobBoard::default(),
            repeats: Arc::new(RepeatTally::new(store_for_tally)),
            budget: Budget::new(DEFAULT_MAX_INFLIGHT_BYTES),
            waits: Mutex::new(HashMap::new()),
            job_key: None,
            tracer: None,
        }
    }

    /// Bounds what answers in flight may hold in memory, over every route: what owners
    /// keep of the answers they record and what their callers have not read yet (default
    /// [`DEFAULT_MAX_INFLIGHT_BYTES`]). See the `budget` module.
    pub fn with_max_inflight_bytes(mut self, bytes: u64) -> Guard {
        self.budget = Budget::new(bytes);
        self
    }

    /// Seals what queued jobs keep (headers, body, query) with `key` before it reaches
    /// the store. Without a key, jobs are stored as sent.
    pub fn with_job_key(mut self, key: crate::seal::JobKey) -> Guard {
        self.job_key = Some(key);
        self
    }

    /// Records a span of every guarded request (and of its upstream call) with `tracer`,
    /// and passes the upstream a `traceparent` of its own. Without one, no span is made
    /// and the caller's `traceparent` reaches the upstream as it came.
    pub fn with_tracer(mut self, tracer: Arc<crate::trace::Tracer>) -> Guard {
        self.tracer = Some(tracer);
        self
    }

    /// The tracer, when traces are on.
    pub fn tracer(&self) -> Option<&Arc<crate::trace::Tracer>> {
        self.tracer.as_ref()
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
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.principal_key).expect("HMAC takes any key size");
        mac.update(raw);
        hex::encode(mac.finalize().into_bytes())
    }

    /// The principal of a single-tenant route (`principal = "none"`).
    pub fn single_tenant_principal(&self) -> String {
        self.principal_hash(b"oncely/single-tenant")
    }

    /// Owned upstream calls (and their ledger writes) running now.
    pub fn in_flight(&self) -> usize {
        self.tasks.current()
    }

    /// Waits until every owned upstream call has finished and been recorded, and every
    /// repeat has been counted. The binary calls it on shutdown after it stops accepting.
    pub async fn drain(&self) {
        self.tasks.wait_idle().await;
        self.flush_repeats().await;
    }

    /// Writes the repeats counted in memory so far to the ledger (one `add_repeats` per
    /// record), and returns once they are written. A background task does this every
    /// [`REPEAT_FLUSH`]; [`Guard::drain`] does it last.
    pub async fn flush_repeats(&self) {
        self.repeats.flush().await
    }

    pub(crate) fn new_owner(&self) -> String {
        format!(
            "{}/{}",
            self.instance,
            self.next_owner.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Claims the call's record and executes it once: as its owner (running `run` on a
    /// task the caller does not own, with the downstream key), or from the ledger
    /// (replay, join, refusal). `run` is called at most once.
    pub async fn execute<F>(&self, call: GuardedCall, run: F) -> Execution
    where
        F: FnOnce(DownstreamKey) -> BoxFuture<'static, Result<UpstreamAnswer, UpstreamError>>
            + Send
            + 'static,
    {
        let deadline = tokio::time::Instant::now() + call.wait;
        let spec = ClaimSpec {
            scope: call.scope.clone(),
            key: call.key.clone(),
            fingerprint: call.fingerprint,
            class: call.class,
            route: call.route.clone(),
            principal: call.principal.clone(),
            owner: self.new_owner(),
            lease: call.lease,
            workflow_id: call.workflow_id.clone(),
        };
        let mut waited = false;
        let mut run = Some(run);
        // Each turn either returns or waits (bounded by `deadline`); the cap only guards
        // against a store that keeps contradicting itself.
        for _ in 0..64 {
            let claim = {
                let store = self.store.clone();
                let spec = spec.clone();
                async move {
                    match store.claim(&spec).await? {
                        Claim::Owned(r) => Ok(Step::Owned(r)),
                        Claim::Existing(r) => Ok(Step::Other(r)),
                    }
                }
                .boxed()
            };
            let f = run.take().expect("run is given back unless owned");
            let mut record = match self.claim_detached(&call, f, claim).await {
                Detached::Owner(record, head) => return owner_answer(record, head).await,
                Detached::Other(record, f) => {
                    run = Some(f);
                    record
                }
                Detached::Failed(e, _) => return Execution::StoreUnavailable(e.to_string()),
                Detached::Broken(why) => return Execution::StoreUnavailable(why),
            };
            // The ledger's clock, read when the decision needs it (afresh for each record).
            let mut now = None;
            loop {
                let wait_left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let seen = Seen {
                    fingerprint: call.fingerprint,
                    claimant: Claimant::Call,
                    waited,
                    wait_left,
                };
                match decide(&record, &seen, now) {
                    Decided::Refuse(Refusal::KeyReused) => return Execution::KeyReused(record),
                    step @ (Decided::Replay
                    | Decided::Join
                    | Decided::Refuse(Refusal::TooLarge)) => {
                        return self.answer_completed(record, waited, step)
                    }
                    Decided::Refuse(Refusal::OutcomeUnknown) => {
                        return Execution::OutcomeUnknown(record)
                    }
                    // The original failed harmlessly while we waited: claim again (and
                    // execute, with the same downstream key, if we win).
                    Decided::ClaimAgain => break,
                    Decided::ReadClock => match self.store.now().await {
                        Ok(n) => now = Some(n),
                        Err(e) => return Execution::StoreUnavailable(e.to_string()),
                    },
                    Decided::TakeOver => {
                        let take_over = {
                            let store = self.store.clone();
                            let (id, attempt) = (record.id.clone(), record.attempt);
                            let (owner, lease) = (spec.owner.clone(), call.lease);
                            async move {
                                match store.take_over(&id, attempt, &owner, lease).await? {
                                    TakeOverOutcome::Owned(r) => Ok(Step::Owned(r)),
                                    TakeOverOutcome::OutcomeUnknown(r) => Ok(Step::Other(r)),
                                }
                            }
                            .boxed()
                        };
                        let f = run.take().expect("run is given back unless owned");
                        match self.claim_detached(&call, f, take_over).await {
                            Detached::Owner(record, head) => {
                                return owner_answer(record, head).await
                            }
                            Detached::Other(record, _) => return Execution::OutcomeUnknown(record),
                            // Someone else moved it first: look again.
                            Detached::Failed(StoreError::Transition(_), f) => {
                                run = Some(f);
                                match self.store.get(&record.id).await {
                                    Ok(Some(r)) => {
                                        record = r;
                                        now = None;
                                    }
                                    Ok(None) => break,
                                    Err(e) => return Execution::StoreUnavailable(e.to_string()),
                                }
                            }
                            Detached::Failed(e, _) => {
                                return Execution::StoreUnavailable(e.to_string())
                            }
                            Detached::Broken(why) => return Execution::StoreUnavailable(why),
                        }
                    }
                    Decided::Refuse(Refusal::StillRunning) => {
                        let retry_after = retry_after(call.wait);
                        return Execution::InFlight {
                            record,
                            retry_after,
                        };
                    }
                    Decided::WaitUntil(lease_until) => {
                        // Wake up when the owner's lease would lapse, to take over a dead
                        // owner without waiting the whole `wait`.
                        let until_lapse = match (lease_until, now) {
                            (Some(l), Some(now)) => now.until(l) + Duration::from_millis(20),
                            _ => wait_left,
                        };
                        waited = true;
                        record = match self
                            .wait_shared(&record.id, wait_left.min(until_lapse))
                            .await
                        {
                            Ok(r) => r,
                            Err(StoreError::NotFound(_)) => break,
                            Err(e) => return Execution::StoreUnavailable(e.to_string()),
                        };
                        now = None;
                    }
                    step @ (Decided::Own | Decided::Refuse(Refusal::Failed | Refusal::Ended)) => {
                        unreachable!("a call is never told {step:?}")
                    }
                }
            }
        }
        Execution::StoreUnavailable("the ledger kept changing under one claim".into())
    }

    /// A completed record: replay or join it, or refuse it as too large (the `step`
    /// [`decide`] gave), and count the repeat off the answer's path.
    pub(crate) fn answer_completed(
        &self,
        record: Record,
        waited: bool,
        step: Decided,
    ) -> Execution {
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
        self.repeats.add(&record.id, kind, record.units);
    }

    /// [`Store::wait_for`], shared by every request of this instance waiting on the same
    /// record: they are woken by one read of it, and share the answer it holds (one
    /// copy, however many joiners). A request whose own `timeout` ends first reads the
    /// record as it is then.
    async fn wait_shared(&self, id: &RecordId, timeout: Duration) -> Result<Record, StoreError> {
        let shared = {
            let mut waits = self.waits.lock().expect("waits lock");
            match waits.get(id) {
                Some(w) => w.clone(),
                None => {
                    let store = self.store.clone();
                    let key = id.clone();
                    let w = async move {
                        store.wait_for(&key, timeout).await.map_err(|e| match e {
                            StoreError::NotFound(id) => WaitError::NotFound(id),
                            other => WaitError::Store(other.to_string()),
                        })
                    }
                    .boxed()
                    .shared();
                    waits.insert(id.clone(), w.clone());
                    w
                }
            }
        };
        // Forgotten by whoever leaves it (woken, timed out or cancelled), so that the
        // next wait reads afresh; the others keep their clones.
        let _forget = ForgetWait {
            waits: &self.waits,
            id,
            shared: shared.clone(),
        };
        match tokio::time::timeout(timeout, shared).await {
            Ok(Ok(record)) => Ok(record),
            Ok(Err(WaitError::NotFound(id))) => Err(StoreError::NotFound(id)),
            Ok(Err(WaitError::Store(e))) => Err(StoreError::Unavailable(e)),
            Err(_) => self
                .store
                .get(id)
                .await?
                .ok_or_else(|| StoreError::NotFound(id.clone())),
        }
    }

    /// Runs `op` (a claim, or a take-over of a lapsed lease) and, when it makes this call
    /// the owner, starts the owner task with `run`, all on a task the caller does not
    /// own: a caller that goes away between a committed claim and the owner's start
    /// would otherwise leave the record processing with nobody running it. Jobs do not
    /// come here: their calls are queued durably with their claim and run by the
    /// [`JobWorker`](crate::jobs::JobWorker) (see [`Guard::submit_job`]).
    async fn claim_detached<F>(
        &self,
        call: &GuardedCall,
        run: F,
        op: BoxFuture<'static, Result<Step, StoreError>>,
    ) -> Detached<F>
    where
        F: FnOnce(DownstreamKey) -> BoxFuture<'static, Result<UpstreamAnswer, UpstreamError>>
            + Send
            + 'static,
    {
        // Counted from before the claim, so that a drain waits for a claim in flight.
        let token = self.tasks.start();
        let store = self.store.clone();
        let budget = self.budget.clone();
        let call = call.clone();
        let task = tokio::spawn(async move {
            let record = match op.await {
                Ok(Step::Owned(record)) => record,
                Ok(Step::Other(record)) => return Detached::Other(record, run),
                Err(e) => return Detached::Failed(e, run),
            };
            let Some(fence) = record.fence() else {
                return Detached::Broken(format!("owned record {} has no owner", record.id));
            };
            let upstream = run(DownstreamKey::derive(&call.scope, &call.key));
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
            }));
            Detached::Owner(record, head_rx)
        });
        match task.await {
            Ok(d) => d,
            Err(e) => Detached::Broken(format!("the claim task ended: {e}")),
        }
    }
}

/// The answer of a call this request owns: the owner task's head (or its failure).
async fn owner_answer(record: Record, head: oneshot::Receiver<owner::Head>) -> Execution {
    match head.await {
        Ok(owner::Head::Answer {
            status,
            headers,
            body,
        }) => Execution::Fresh(FreshAnswer {
            record,
            status,
            headers,
            body,
        }),
        Ok(owner::Head::Failed { record, failure }) => Execution::UpstreamFailed {
            record: *record,
            failure,
        },
        // The owner task panicked: the record stays processing until its lease lapses.
        Err(_) => Execution::UpstreamFailed {
            record,
            failure: UpstreamFailure::Lost("the owner task ended without an answer".into()),
        },
    }
}

/// The default bound of what answers in flight may hold in memory (512 MiB).
pub const DEFAULT_MAX_INFLIGHT_BYTES: u64 = 512 << 20;

/// One `wait_for` shared by the requests of this instance waiting on one record.
type SharedWait = Shared<BoxFuture<'static, Result<Record, WaitError>>>;

/// A shared wait's error (a [`StoreError`] is not `Clone`).
#[derive(Debug, Clone)]
enum WaitError {
    NotFound(RecordId),
    Store(String),
}

/// Removes a shared wait from the map when one of its waiters leaves, unless the map
/// already holds a newer one.
struct ForgetWait<'a> {
    waits: &'a Mutex<HashMap<RecordId, SharedWait>>,
    id: &'a RecordId,
    shared: SharedWait,
}

impl Drop for ForgetWait<'_> {
    fn drop(&mut self) {
        let mut waits = self.waits.lock().expect("waits lock");
        if waits.get(self.id).is_some_and(|w| w.ptr_eq(&self.shared)) {
            waits.remove(self.id);
        }
    }
}

/// What a claim or a take-over found.
enum Step {
    /// This call owns the record now.
    Owned(Record),
    /// Someone else's record (an existing one; for a take-over, an `outcome_unknown`).
    Other(Record),
}

/// A claim run on a task of its own, with `run` given back when it did not own.
enum Detached<F> {
    /// Owned, and the owner task runs: its head comes through the receiver.
    Owner(Record, oneshot::Receiver<owner::Head>),
    /// Not owned.
    Other(Record, F),
    /// The store failed.
    Failed(StoreError, F),
    /// Owned, but the record came back without an owner (a store bug), or the task died.
    Broken(String),
}

/// When a duplicate refused with `in_flight` should ask again: half the route's `wait`,
/// between 1 and 60 seconds.
pub(crate) fn retry_after(wait: Duration) -> Duration {
    (wait / 2).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// How often the repeats counted in memory are written to the ledger.
pub const REPEAT_FLUSH: Duration = Duration::from_millis(200);

/// At most this many repeat events wait in memory (over every record) while the ledger
/// cannot take them; beyond it a repeat is still counted, only not listed in statements.
const MAX_PENDING_EVENTS: usize = 100_000;

/// One record's repeats not yet written.
#[derive(Debug, Default)]
struct PendingRepeats {
    /// Each one, with its time and kind (for statements).
    events: Vec<Repeat>,
    /// Repeats over [`MAX_PENDING_EVENTS`]: counted, not kept one by one.
    unlisted: u64,
    unlisted_units: u64,
}

/// Repeats per record not yet written, and how many events they hold.
#[derive(Debug, Default)]
struct Pending {
    by_record: HashMap<RecordId, PendingRepeats>,
    events: usize,
}

/// Repeats counted in memory until the next flush. The flushing task holds only a weak
/// reference, so it ends with the guard.
struct RepeatTally {
    store: Arc<dyn Store>,
    pending: Mutex<Pending>,
    /// Held while a flush writes, so that [`RepeatTally::flush`] returns only once every
    /// repeat taken before it (by the background task too) is in the ledger.
    writing: tokio::sync::Mutex<()>,
    flusher: AtomicBool,
    max_events: usize,
}

impl RepeatTally {
    fn new(store: Arc<dyn Store>) -> RepeatTally {
        RepeatTally {
            store,
            pending: Mutex::new(Pending::default()),
            writing: tokio::sync::Mutex::new(()),
            flusher: AtomicBool::new(false),
            max_events: MAX_PENDING_EVENTS,
        }
    }

    /// Counts one repeat of `id` worth `units`, and starts the flushing task on first use
    /// (on the caller's runtime). No store call: the repeat is written with the next flush.
    fn add(self: &Arc<Self>, id: &RecordId, kind: RepeatKind, units: u64) {
        {
            let mut pending = self.pending.lock().expect("repeat tally lock");
            let keep = pending.events < self.max_events;
            if keep {
                pending.events += 1;
            }
            let entry = pending.by_record.entry(id.clone()).or_default();
            if keep {
                entry.events.push(Repeat {
                    // The gateway's own clock: no store round trip on the answer's path.
                    at: oncely_store::clock::system_now(),
                    kind,
                    units,
                });
            } else {
                entry.unlisted += 1;
                entry.unlisted_units += units;
            }
        }
        if !self.flusher.load(Ordering::Relaxed) && !self.flusher.swap(true, Ordering::AcqRel) {
            let tally = Arc::downgrade(self);
            tokio::spawn(flush_every(tally, REPEAT_FLUSH));
        }
    }

    async fn flush(&self) {
        let _writing = self.writing.lock().await;
        let taken = std::mem::take(&mut *self.pending.lock().expect("repeat tally lock"));
        for (id, mut repeats) in taken.by_record {
            let mut result = Ok(());
            if !repeats.events.is_empty() {
                result = self.store.record_repeats(&id, &repeats.events).await;
                if result.is_ok() {
                    repeats.events.clear();
                }
            }
            if result.is_ok() && repeats.unlisted > 0 {
                result = self
                    .store
                    .add_repeats(&id, repeats.unlisted, repeats.unlisted_units)
                    .await;
                if result.is_ok() {
                    repeats.unlisted = 0;
                    repeats.unlisted_units = 0;
                }
            }
            match result {
                Ok(()) => {}
                // The record is gone (purged): nothing left to count on.
                Err(StoreError::NotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(target: "oncely::store", record = %id, repeats = repeats.events.len() as u64 + repeats.unlisted, error = %e, "could not count repeats; will retry");
                    let mut pending = self.pending.lock().expect("repeat tally lock");
                    pending.events += repeats.events.len();
                    let entry = pending.by_record.entry(id).or_default();
                    let later = std::mem::replace(entry, repeats);
                    entry.events.extend(later.events);
                    entry.unlisted += later.unlisted;
                    entry.unlisted_units += later.unlisted_units;
                }
            }
        }
    }
}

async fn flush_every(tally: Weak<RepeatTally>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(tally) = tally.upgrade() else { return };
        let idle = tally
            .pending
            .lock()
            .expect("repeat tally lock")
            .by_record
            .is_empty();
        if !idle {
            tally.flush().await;
        }
    }
}

/// Counts background tasks (owned upstream calls); `wait_idle` returns when none runs.
#[derive(Debug)]
pub(crate) struct TaskCount(watch::Sender<usize>);

impl Default for TaskCount {
    fn default() -> TaskCount {
        TaskCount(watch::channel(0).0)
    }
}

/// One counted task; dropping it uncounts it.
pub(crate) struct TaskToken(watch::Sender<usize>);

impl TaskCount {
    pub(crate) fn start(&self) -> TaskToken {
        self.0.send_modify(|n| *n += 1);
        TaskToken(self.0.clone())
    }

    pub(crate) fn current(&self) -> usize {
        *self.0.borrow()
    }

    pub(crate) async fn wait_idle(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

impl Drop for TaskToken {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use http_body_util::BodyExt;
    use oncely_core::{Fingerprint, State};

    fn call(key: &str) -> GuardedCall {
        GuardedCall {
            scope: Scope::new("p", "/mcp#render"),
            key: key.to_string(),
            fingerprint: Fingerprint([7; 32]),
            class: Class::Write,
            route: "/mcp#render".into(),
            principal: "p".into(),
            window: Duration::from_secs(60),
            wait: Duration::from_secs(1),
            lease: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
            max_response: 1024,
            workflow_id: None,
            units: 3,
            answer_before_record: false,
        }
    }

    async fn run_with(guard: &Guard, key: &str, body: &'static str, classify: Classifier) {
        let execution = guard
            .execute(call(key), move |_| {
                async move {
                    Ok(UpstreamAnswer::new(
                        StatusCode::OK,
                        HeaderMap::new(),
                        crate::body::full(body),
                    )
                    .with_classifier(classify))
                }
                .boxed()
            })
            .await;
        let Execution::Fresh(fresh) = execution else {
            panic!("expected a fresh execution, got {execution:?}");
        };
        // The caller still gets what the upstream sent, byte for byte.
        let seen = fresh.body.collect().await.unwrap().to_bytes();
        assert_eq!(seen, body.as_bytes());
        guard.drain().await;
    }

    #[tokio::test]
    async fn a_classifier_decides_what_is_stored_or_released() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let guard = Guard::new(store.clone(), b"k".to_vec());

        // Store: the classifier's response is kept, not the upstream's bytes.
        run_with(
            &guard,
            "stored",
            "event: message\ndata: {\"result\":1}\n\n",
            Box::new(|status, _headers, body| {
                assert_eq!(status, StatusCode::OK);
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
            .execute(call("stored"), |_| {
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
            Box::new(|_, _, _| Classified::Release("a JSON-RPC error".into())),
        )
        .await;
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let again = guard
            .execute(call("released"), move |_| {
                flag.store(true, Ordering::SeqCst);
                async {
                    Ok(UpstreamAnswer::new(
                        StatusCode::OK,
                        HeaderMap::new(),
                        crate::body::full("ok"),
                    ))
                }
                .boxed()
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
        let guard = Guard::new(store.clone(), b"k".to_vec());
        let big: &'static str = Box::leak("x".repeat(2048).into_boxed_str());
        run_with(
            &guard,
            "big",
            big,
            Box::new(|_, _, _| panic!("not called when the body was not kept")),
        )
        .await;
        assert!(matches!(
            guard
                .execute(call("big"), |_| panic!("no second run"))
                .await,
            Execution::TooLarge(_)
        ));
    }

    async fn completed(guard: &Guard, key: &str) -> Record {
        let execution = guard
            .execute(call(key), |_| {
                async {
                    Ok(UpstreamAnswer::new(
                        StatusCode::OK,
                        HeaderMap::new(),
                        crate::body::full("done"),
                    ))
                }
                .boxed()
            })
            .await;
        let Execution::Fresh(fresh) = execution else {
            panic!("expected a fresh execution, got {execution:?}");
        };
        fresh.body.collect().await.unwrap();
        guard.drain().await;
        fresh.record
    }

    async fn replay_n(guard: &Guard, key: &str, n: usize) {
        for _ in 0..n {
            match guard.execute(call(key), |_| panic!("no second run")).await {
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
        let guard = Guard::new(store.clone(), b"k".to_vec());
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
    async fn each_repeat_is_kept_with_its_kind_and_over_the_cap_only_counted() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let mut guard = Guard::new(store.clone(), b"k".to_vec());
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
        assert_eq!((events.total, events.total_units), (3, 9), "three listed");
        assert!(events
            .listed
            .iter()
            .all(|e| e.kind == RepeatKind::Replayed && e.units == 3 && e.record == a.id));
        // The cap is on what waits: after a flush, the next repeats are kept again.
        replay_n(&guard, "a", 2).await;
        guard.flush_repeats().await;
        let events = store.repeat_events(&a.principal, None, 100).await.unwrap();
        assert_eq!(events.total, 5);
    }

    #[tokio::test]
    async fn drain_writes_every_counted_repeat() {
        let store = oncely_store::open("memory:", Default::default())
            .await
            .unwrap();
        let guard = Guard::new(store.clone(), b"k".to_vec());
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
        let guard = Guard::new(store.clone(), b"k".to_vec());
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
