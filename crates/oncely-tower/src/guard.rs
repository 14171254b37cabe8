//! The HTTP edge of the engine. [`Guard::execute`] is [`oncely_engine::Engine::execute`]
//! with HTTP types: it hands the engine the upstream's answer as plain data (status,
//! body stream, and what only an HTTP reader can tell: which headers a stored answer
//! keeps, the replay window the upstream asked for with `Oncely-Replay-Until` /
//! `Oncely-Replay-Seconds`, the provider's request id) and turns the engine's answer back
//! into an HTTP status, headers and body. Everything the ledger decides lives in the
//! engine; this file only translates.
//!
//! The [`Guard`] also holds what the HTTP layer and its jobs share beside the engine: the
//! tracer, the job key and the job board.

use std::sync::Arc;

use futures::future::FutureExt;
use http::{HeaderMap, StatusCode};
use oncely_core::{DownstreamKey, Record, Timestamp};
use oncely_engine::Engine;
use oncely_store::Store;

pub use oncely_engine::{
    Classified, GuardedCall, UpstreamError, UpstreamFailure, DEFAULT_MAX_INFLIGHT_BYTES,
    REPEAT_FLUSH,
};

use crate::job_board::JobBoard;
use crate::problem::{REPLAY_SECONDS, REPLAY_UNTIL};
use crate::BoxBody;

/// The upstream's answer, as the `run` closure of [`Guard::execute`] returns it.
pub struct UpstreamResponse {
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

impl UpstreamResponse {
    /// An answer stored as it comes (no units of its own, no classifier).
    pub fn new(status: StatusCode, headers: HeaderMap, body: BoxBody) -> UpstreamResponse {
        UpstreamResponse {
            status,
            headers,
            body,
            units: None,
            classify: None,
        }
    }

    /// Sets the units the answer names.
    pub fn with_units(mut self, units: Option<u64>) -> UpstreamResponse {
        self.units = units;
        self
    }

    /// Sets the classifier that decides what is stored.
    pub fn with_classifier(mut self, classify: Classifier) -> UpstreamResponse {
        self.classify = Some(classify);
        self
    }
}

impl std::fmt::Debug for UpstreamResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamResponse")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("units", &self.units)
            .field("classify", &self.classify.is_some())
            .finish_non_exhaustive()
    }
}

/// Reads an answer's status, headers and whole body after the owner task has streamed
/// it, and decides what the ledger keeps. Called at most once, and only when the class
/// would store the answer and its body was kept (not over `max_response`); otherwise it
/// is dropped uncalled (when the owner task ends).
pub type Classifier = Box<dyn FnOnce(StatusCode, &HeaderMap, &[u8]) -> Classified + Send>;

/// The owner's upstream call, as the `run` closure of [`Guard::execute`] returns it.
pub type UpstreamCall =
    futures::future::BoxFuture<'static, Result<UpstreamResponse, UpstreamError>>;

/// The answer of a call this request owned and executed now.
pub struct FreshResponse {
    /// The record as claimed (processing): its id and attempt. It is completed (or
    /// released) by the owner task once the body has been read; the body ends after
    /// that write.
    pub record: oncely_core::Record,
    /// The upstream's status.
    pub status: StatusCode,
    /// The upstream's headers.
    pub headers: HeaderMap,
    /// The upstream's body, streamed.
    pub body: BoxBody,
}

impl std::fmt::Debug for FreshResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshResponse")
            .field("record", &self.record.id)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// What [`Guard::execute`] did. The HTTP layer is a thin translation of this.
pub type Execution = oncely_engine::Execution<FreshResponse>;

/// The guard: the [`Engine`] (ledger, principal key, owners, repeats, in-flight budget)
/// with what the HTTP layer adds to it: the tracer, the job key and the job board.
pub struct Guard {
    engine: Engine,
    pub(crate) jobs: JobBoard,
    pub(crate) job_key: Option<crate::seal::JobKey>,
    tracer: Option<Arc<crate::trace::Tracer>>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// A guard on `store`, hashing principals with `principal_key` (HMAC-SHA256).
    pub fn new(store: Arc<dyn Store>, principal_key: Vec<u8>) -> Guard {
        Guard {
            engine: Engine::new(store, principal_key),
            jobs: JobBoard::default(),
            job_key: None,
            tracer: None,
        }
    }

    /// Bounds what answers in flight may hold in memory, over every route: what owners
    /// keep of the answers they record and what their callers have not read yet (default
    /// [`DEFAULT_MAX_INFLIGHT_BYTES`]).
    pub fn with_max_inflight_bytes(mut self, bytes: u64) -> Guard {
        self.engine = self.engine.with_max_inflight_bytes(bytes);
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

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The ledger.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.engine.store()
    }

    /// This instance's id (owners are `INSTANCE/N`).
    pub fn instance(&self) -> &str {
        self.engine.instance()
    }

    /// The keyed hash a raw principal is stored as: HMAC-SHA256 in lower-case hex. The
    /// CLI uses it to filter the ledger by a principal's raw value.
    pub fn principal_hash(&self, raw: &[u8]) -> String {
        self.engine.principal_hash(raw)
    }

    /// Owned upstream calls (and their ledger writes) running now.
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }

    /// Waits until every owned upstream call has finished and been recorded, and every
    /// repeat has been counted. The binary calls it on shutdown after it stops accepting.
    pub async fn drain(&self) {
        self.engine.drain().await
    }

    /// Writes the repeats counted in memory so far to the ledger, and returns once they
    /// are written. A background task does this every [`REPEAT_FLUSH`]; [`Guard::drain`]
    /// does it last.
    pub async fn flush_repeats(&self) {
        self.engine.flush_repeats().await
    }

    /// Claims the call's record and executes it once: as its owner (running `run` on a
    /// task the caller does not own, with the downstream key and the record as claimed),
    /// or from the ledger (replay, join, refusal). `run` is called at most once.
    pub async fn execute<F>(&self, call: GuardedCall, run: F) -> Execution
    where
        F: FnOnce(DownstreamKey, &Record) -> UpstreamCall + Send + 'static,
    {
        let run = move |key: DownstreamKey, record: &Record| to_engine(run(key, record));
        self.engine.execute(call, run).await.map_fresh(fresh)
    }
}

/// The upstream call as the engine runs it: its answer in plain data, the headers handed
/// back to the caller untouched.
pub(crate) fn to_engine(call: UpstreamCall) -> oncely_engine::UpstreamFuture<HeaderMap> {
    Box::pin(call.map(|answer| answer.map(answer_to_engine)))
}

fn answer_to_engine(answer: UpstreamResponse) -> oncely_engine::UpstreamAnswer<HeaderMap> {
    let UpstreamResponse {
        status,
        headers,
        body,
        units,
        classify,
    } = answer;
    let facts = AnswerFacts::read(&headers);
    let classify = classify.map(|classify| {
        let headers = headers.clone();
        Box::new(move |body: &[u8]| classify(status, &headers, body)) as oncely_engine::Classifier
    });
    oncely_engine::UpstreamAnswer {
        length: facts.length,
        status: status.as_u16(),
        stored_headers: facts.stored_headers,
        provider_request_id: facts.provider_request_id,
        replay_until: facts.replay_until,
        replay_seconds: facts.replay_seconds,
        units,
        classify,
        body: crate::body::stream(body),
        head: headers,
    }
}

/// What the ledger keeps that an HTTP answer's headers tell, in plain data (the MCP
/// core carries it from its HTTP server to the engine).
#[derive(Debug, Clone, Default)]
pub struct AnswerFacts {
    /// The headers a stored answer keeps (and a replay carries).
    pub stored_headers: Vec<(String, String)>,
    /// The end of the replay window the upstream asked for (`Oncely-Replay-Until`).
    pub replay_until: Option<Timestamp>,
    /// The replay window the upstream asked for in seconds (`Oncely-Replay-Seconds`).
    pub replay_seconds: Option<u64>,
    /// The upstream's own id of the request.
    pub provider_request_id: Option<String>,
    /// The body's declared length (`Content-Length`).
    pub length: Option<u64>,
}

impl AnswerFacts {
    /// What `headers` tell the ledger.
    pub fn read(headers: &HeaderMap) -> AnswerFacts {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        AnswerFacts {
            stored_headers: crate::headers::replayable_headers(headers),
            replay_until: text(REPLAY_UNTIL).and_then(|t| Timestamp::parse_rfc3339(t).ok()),
            replay_seconds: text(REPLAY_SECONDS).and_then(|t| t.trim().parse::<u64>().ok()),
            provider_request_id: crate::log::provider_request_id(headers),
            length: text(http::header::CONTENT_LENGTH.as_str()).and_then(|t| t.parse::<u64>().ok()),
        }
    }
}

/// The engine's fresh answer as an HTTP one.
pub(crate) fn fresh(answer: oncely_engine::FreshAnswer<HeaderMap>) -> FreshResponse {
    let oncely_engine::FreshAnswer {
        record,
        status,
        head: headers,
        body,
    } = answer;
    let length = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    FreshResponse {
        record,
        // The status came from a `StatusCode` (see `answer_to_engine`).
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        headers,
        body: crate::body::caller(body, length),
    }
}
