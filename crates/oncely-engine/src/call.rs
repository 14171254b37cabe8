//! What goes into the engine and comes out of it, in plain data: the call
//! ([`GuardedCall`]), the upstream's answer ([`UpstreamAnswer`]), what the owner task
//! tells its caller first ([`Head`]) and what a call got ([`Execution`]). A leaf: the
//! engine and the owner task both use it.

use std::time::Duration;

use futures::future::BoxFuture;
use oncely_core::{Disposition, Identity, Record, StoredResponse, Timestamp};

use crate::stream::{BodyStream, CallerBody};

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

/// The upstream's answer, as the `run` closure of `Engine::execute` returns it, in
/// plain data: the protocol layer has already read from its own answer what the engine
/// needs (what a stored answer keeps, the replay window the upstream asked for, its
/// request id) and hands the rest back to its caller untouched as `head`.
pub struct UpstreamAnswer<H> {
    /// Status.
    pub status: u16,
    /// What the protocol layer gives back to its caller with the body (for HTTP, the
    /// upstream's headers); the engine only passes it on.
    pub head: H,
    /// The body; the owner task streams it to the caller while it records it.
    pub body: BodyStream,
    /// Billing units the answer itself names; `None` keeps [`GuardedCall::units`].
    pub units: Option<u64>,
    /// The headers a stored answer keeps (and a replay carries), when it is stored as it
    /// came (no classifier, or a body too large to keep).
    pub stored_headers: Vec<(String, String)>,
    /// The end of the replay window the upstream asked for, if any.
    pub replay_until: Option<Timestamp>,
    /// The replay window the upstream asked for in seconds from its recording, if any
    /// (the earlier of this and `replay_until` wins).
    pub replay_seconds: Option<u64>,
    /// The upstream's own id of the request, kept with the record.
    pub provider_request_id: Option<String>,
    /// Decides what is stored once the whole body has been read; `None` stores the answer
    /// as it came. See [`Classifier`].
    pub classify: Option<Classifier>,
    /// The body's length, when the caller is told it in advance (HTTP's `content-length`).
    /// Such a caller has the whole answer once it has the last byte, not when the body
    /// ends; so unless the call answers before its record, the chunk that completes this
    /// length waits until the answer is recorded.
    pub length: Option<u64>,
}

impl<H> UpstreamAnswer<H> {
    /// An answer stored as it comes, keeping no headers (set the other fields as needed).
    pub fn new(status: u16, head: H, body: BodyStream) -> UpstreamAnswer<H> {
        UpstreamAnswer {
            status,
            head,
            body,
            units: None,
            stored_headers: Vec::new(),
            replay_until: None,
            replay_seconds: None,
            provider_request_id: None,
            classify: None,
            length: None,
        }
    }
}

impl<H: std::fmt::Debug> std::fmt::Debug for UpstreamAnswer<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamAnswer")
            .field("status", &self.status)
            .field("head", &self.head)
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

impl Classified {
    /// The response to store, or how the record is settled instead (released or
    /// `outcome_unknown`) and why.
    pub(crate) fn into_stored(self) -> Result<StoredResponse, (Disposition, String)> {
        match self {
            Classified::Store(response) => Ok(response),
            Classified::Release(why) => Err((Disposition::Release, why)),
            Classified::Unknown(why) => Err((Disposition::OutcomeUnknown, why)),
        }
    }
}

/// Reads an answer's whole body after the owner task has streamed it, and decides what
/// the ledger keeps (the protocol layer captures the status and headers it needs).
/// Called at most once, and only when the class would store the answer and its body was
/// kept (not over `max_response`); otherwise it is dropped uncalled (when the owner task
/// ends).
pub type Classifier = Box<dyn FnOnce(&[u8]) -> Classified + Send>;

/// One guarded call, protocol-agnostic: who and what (its [`Identity`], which it
/// dereferences to), and the route's timings.
#[derive(Debug, Clone)]
pub struct GuardedCall {
    /// The intention ([`Identity::new`]): its class is `write`, `action` or `job` (`read`
    /// is never guarded), its principal the keyed hash the engine's principal key makes
    /// (`Engine::principal_hash`).
    pub identity: Identity,
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
    /// Billing units of one execution, as known from the request.
    pub units: u64,
    /// End the caller's body before the completion is durable (the route's `answer =
    /// "before_record"`); by default it ends after.
    pub answer_before_record: bool,
    /// The route's upstream slots (its `concurrency`), when it has a limit. The owner
    /// takes one before it sends and holds it until the answer is read. While it waits
    /// for one, `timeout` measures the wait: a call still waiting when it runs out was
    /// never sent, so its record is released and the caller is told the upstream is
    /// busy; once a slot is taken, the upstream gets its whole `timeout`.
    pub slots: Option<std::sync::Arc<tokio::sync::Semaphore>>,
    /// The span of the request that executes it, kept with its completion (as
    /// `TRACEID-SPANID`, hex) so that replays and joins link to it (traces on).
    pub trace: Option<SpanRef>,
    /// Set for a call under a client key on a route that recognises keys made up for
    /// each attempt (`churn_window`): the claim may join another key's record whose
    /// caller never got its answer, and this call's own answer says whether it reached
    /// its caller (see [`crate::delivery`]).
    pub churn: Option<crate::CallChurn>,
}

/// A span's trace id and span id: written as `TRACEID-SPANID` (hex) only when a
/// completion keeps it, not for each request that might.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanRef {
    /// The trace id.
    pub trace_id: [u8; 16],
    /// The span id.
    pub span_id: [u8; 8],
}

impl std::fmt::Display for SpanRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.trace_id {
            write!(f, "{b:02x}")?;
        }
        f.write_str("-")?;
        for b in self.span_id {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::ops::Deref for GuardedCall {
    type Target = Identity;
    fn deref(&self) -> &Identity {
        &self.identity
    }
}

/// The answer of a call this request owned and executed now.
pub struct FreshAnswer<H> {
    /// The record as claimed (processing): its id and attempt. It is completed (or
    /// released) by the owner task once the body has been read; the body ends after
    /// that write.
    pub record: Record,
    /// The upstream's status.
    pub status: u16,
    /// What the protocol layer handed over with the upstream's answer.
    pub head: H,
    /// The upstream's body, streamed.
    pub body: CallerBody,
}

impl<H> std::fmt::Debug for FreshAnswer<H> {
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

/// What `Engine::execute` did, with a fresh answer of type `F` (the engine's is a
/// [`FreshAnswer`]; a protocol layer maps it to its own with [`Execution::map_fresh`]).
/// The HTTP layer is a thin translation of this.
#[derive(Debug)]
pub enum Execution<F> {
    /// This call owned the record and executed upstream now.
    Fresh(F),
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
    /// with the job's id (jobs are queued by the protocol layer, which builds this).
    Accepted {
        /// The processing record (its id is the job id).
        record: Record,
        /// Whether this request started the job (else it joined a running one).
        first: bool,
        /// When to ask again.
        retry_after: Duration,
    },
}

impl<F> Execution<F> {
    /// The ledger record it was answered from, for every case but a fresh answer (whose
    /// record its `F` holds) and an unavailable ledger.
    pub fn record(&self) -> Option<&Record> {
        match self {
            Execution::Fresh(_) | Execution::StoreUnavailable(_) => None,
            Execution::Replayed(r)
            | Execution::Joined(r)
            | Execution::OutcomeUnknown(r)
            | Execution::TooLarge(r)
            | Execution::KeyReused(r) => Some(r),
            Execution::InFlight { record, .. }
            | Execution::UpstreamFailed { record, .. }
            | Execution::Accepted { record, .. } => Some(record),
        }
    }

    /// The same execution with its fresh answer mapped by `f` (every other case carries
    /// only ledger data).
    pub fn map_fresh<G>(self, f: impl FnOnce(F) -> G) -> Execution<G> {
        match self {
            Execution::Fresh(fresh) => Execution::Fresh(f(fresh)),
            Execution::Replayed(r) => Execution::Replayed(r),
            Execution::Joined(r) => Execution::Joined(r),
            Execution::InFlight {
                record,
                retry_after,
            } => Execution::InFlight {
                record,
                retry_after,
            },
            Execution::OutcomeUnknown(r) => Execution::OutcomeUnknown(r),
            Execution::TooLarge(r) => Execution::TooLarge(r),
            Execution::KeyReused(r) => Execution::KeyReused(r),
            Execution::StoreUnavailable(why) => Execution::StoreUnavailable(why),
            Execution::UpstreamFailed { record, failure } => {
                Execution::UpstreamFailed { record, failure }
            }
            Execution::Accepted {
                record,
                first,
                retry_after,
            } => Execution::Accepted {
                record,
                first,
                retry_after,
            },
        }
    }
}

/// What the owner task tells its caller first.
pub enum Head<H> {
    /// The upstream answered; the body follows through the channel.
    Answer {
        /// The upstream's status.
        status: u16,
        /// What the protocol layer handed over with the answer.
        head: H,
        /// The body, as the owner reads it.
        body: CallerBody,
    },
    /// No answer: the record as the failure left it.
    Failed {
        /// The record after the failure was written.
        record: Box<Record>,
        /// What happened.
        failure: UpstreamFailure,
    },
}

impl<H> Head<H> {
    /// The execution of the call that owns `record`, from its owner's head.
    pub fn into_execution(self, record: Record) -> Execution<FreshAnswer<H>> {
        match self {
            Head::Answer { status, head, body } => Execution::Fresh(FreshAnswer {
                record,
                status,
                head,
                body,
            }),
            Head::Failed { record, failure } => Execution::UpstreamFailed {
                record: *record,
                failure,
            },
        }
    }
}

impl<H> std::fmt::Debug for Head<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Head::Answer { status, .. } => f
                .debug_struct("Answer")
                .field("status", status)
                .finish_non_exhaustive(),
            Head::Failed { record, failure } => f
                .debug_struct("Failed")
                .field("record", &record.id)
                .field("failure", failure)
                .finish(),
        }
    }
}

/// The upstream call an owner runs, given the downstream key.
pub type UpstreamFuture<H> = BoxFuture<'static, Result<UpstreamAnswer<H>, UpstreamError>>;
