//! The transport-neutral core of MCP mode: one JSON-RPC message (or batch) in, with what
//! its transport knows of it ([`Context`]); what to send back out ([`Reply`]): messages
//! oncely writes, the server's answer passed on (a stream), a refusal, or nothing. The
//! server is reached through the [`Server`] trait. The HTTP endpoint (`crate::endpoint`)
//! and the stdio wrapper (`crate::stdio`) both drive it; nothing here knows HTTP.
//!
//! What the core does to a message:
//! - a `notifications/cancelled` naming a guarded call in flight is taken and never sent
//!   on, so the client's timeout never abandons the paid work (in a session it is
//!   honoured towards the client, whose request gets no (more) answer);
//! - a `tools/call` that cannot be read as one call to guard is refused;
//! - a guarded `tools/call` (see [`crate::catalog`]) goes to the gateway's one engine
//!   (`guarded`): claimed on the ledger, run on an owner task its client does not own,
//!   answered from the ledger when it repeats (`answer`);
//! - `tasks/get`, `tasks/cancel`, `tasks/update` (2026-07-28) are answered from the
//!   ledger for oncely's tasks (`task_requests`), sent on for the server's own;
//! - a JSON-RPC batch (2025-03-26) is split so that each guarded call is guarded on its
//!   own (`batch`);
//! - everything else is sent to the server unchanged, and the `tools/list` and
//!   `server/discover` answers are edited on the way ([`edit`]).
//!
//! A guarded call is keyed by what [`jsonrpc::ToolCall`](crate::jsonrpc::ToolCall) reads
//! (tool, arguments, and a multi-round-trip continuation's `inputResponses` and
//! `requestState`), so nothing else it carries changes whether or how it is guarded. The forwarded guarded call carries
//! the derived downstream key in `_meta["dev.oncely/idempotency-key"]` and no `task`
//! parameter; tools listed in `actions` are class `action`.
//! What is stored is decided by a [`Classifier`](oncely_tower::Classifier) once the owner
//! task has read the whole answer: the JSON-RPC `result` for the call's id (found in a
//! JSON body, a batch, or an event stream) is stored; a JSON-RPC `error` or an HTTP error
//! releases the record, so the next identical call runs again, and so does an
//! `input_required` result (the server asks for input: the continuation that answers it is
//! the call that executes); an answer that ends (or breaks off) without the
//! call's response marks it `outcome_unknown` (it was sent and may have run). An answer over
//! `max_response` is stored without its body: repeats get an `isError` result saying the
//! result was too large to keep, and the tool does not run again within the window.
//! Every result oncely writes is shaped for the request's revision (`for_revision`).
//!
//! A `tools/call` inside a JSON-RPC batch (protocol 2025-03-26 only; batching was removed
//! in 2025-06-18) is guarded too: the batch is split, each guarded call goes through the
//! engine on its own, the rest is forwarded as a smaller batch, and the answers are joined
//! into one JSON array.
//!
//! # Layout
//!
//! - `server`: the [`Server`] trait, its answer, and [`Messages`] (a server answering each
//!   message with one response, as the stdio child and the remote link do).
//! - `call` reads a guarded call, `guarded` runs it through the engine, `answer` maps an
//!   execution to a [`Reply`], `results` writes oncely's results and tasks as JSON,
//!   `task_requests` answers the tasks extension, `batch` splits a batch, [`edit`] edits
//!   the answers oncely reads on the way, `sessions` keeps the guarded calls in flight by
//!   client session.

mod answer;
mod batch;
mod call;
mod context;
pub mod edit;
mod guarded;
mod results;
pub(crate) mod server;
mod sessions;
mod shared;
mod task_requests;

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::StreamExt;
use oncely_core::Record;
use oncely_http::problem::ProblemCode;
use oncely_tower::Guard;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::catalog::ToolCatalog;
use crate::config::McpConfig;
use crate::jsonrpc;
use crate::jsonrpc::code;
use crate::sse;
use call::read_call;
pub(crate) use call::unreadable_call;
use edit::AnswerEdit;
use sessions::Sessions;
use shared::Shared;
use task_requests::TaskAnswer;

pub use context::{Caller, Context, KnownCaller};

pub use server::{
    BodyStream, Framing, LedgerFacts, MessageServer, Messages, Outgoing, Refusal, Server,
    ServerAnswer,
};

/// Protocol revisions that use the initialize handshake and sessions; any later one is
/// the stateless era (2026-07-28), whose routing headers must match the body.
pub const HANDSHAKE_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Whether `revision` is of the stateless era (2026-07-28 or later): a revision without
/// the initialize handshake.
pub fn is_stateless(revision: &str) -> bool {
    !HANDSHAKE_VERSIONS.contains(&revision)
}

/// How oncely marks an answer it gives for a guarded call (HTTP: `Oncely-Status`,
/// `Oncely-Record`, `Idempotent-Replayed`, `Retry-After`).
#[derive(Debug, Clone, Default)]
pub struct Mark {
    /// `fresh`, `replayed`, `joined`, `in_flight`; `None` marks only the record.
    pub status: Option<&'static str>,
    /// The record's id.
    pub record: String,
    /// The answer is a stored one.
    pub replayed: bool,
    /// When to ask again, in seconds.
    pub retry_after: Option<u64>,
}

impl Mark {
    fn of(status: Option<&'static str>, record: &Record) -> Mark {
        Mark {
            status,
            record: record.id.as_str().to_string(),
            ..Mark::default()
        }
    }
}

/// What a message is answered with.
pub enum Reply<H> {
    /// A message oncely writes itself (a result, a replay, a JSON-RPC error, or a batch
    /// as one array), with its mark.
    Message(Value, Option<Mark>),
    /// A protocol error oncely refuses the message with (HTTP answers it with 400).
    Refused(Value),
    /// Nothing to answer: the message was taken (HTTP: 202).
    Accepted,
    /// The client cancelled its request: it gets no answer.
    Cancelled,
    /// The server's answer, passed on as it streams: edited on the way by `edit`, marked
    /// with `mark`, and ended early when `cancel` resolves (the client cancelled).
    Server {
        /// The answer.
        answer: ServerAnswer<H>,
        /// Edits the answers oncely reads on the way (`tools/list`, `server/discover`).
        edit: Option<edit::EditFn>,
        /// oncely's mark (a guarded call's fresh answer).
        mark: Option<Mark>,
        /// Resolves when the client cancels its request.
        cancel: Option<BoxFuture<'static, ()>>,
    },
    /// oncely could not answer (HTTP: a problem+json; a message transport: a JSON-RPC
    /// error to the request `id`).
    Failed {
        /// The request it answers, if it is one.
        id: Option<Value>,
        /// Which failure.
        code: ProblemCode,
        /// What happened.
        detail: String,
    },
}

impl<H> Reply<H> {
    fn failed(id: Option<&Value>, code: ProblemCode, detail: &str) -> Reply<H> {
        Reply::Failed {
            id: id.cloned(),
            code,
            detail: detail.to_string(),
        }
    }

    /// The reply as the messages a message transport writes (a stdio host), in order:
    /// the server's answer read whole (edited, and nothing once its client cancelled), a
    /// failure as the JSON-RPC error of its request. `batch` says the message was a
    /// batch: its answers are one batch.
    pub async fn into_messages(self, batch: bool) -> Vec<Value> {
        let messages = match self {
            Reply::Message(message, _) | Reply::Refused(message) => vec![message],
            Reply::Accepted | Reply::Cancelled => Vec::new(),
            Reply::Failed { id, code, detail } => {
                let Some(id) = id else { return Vec::new() };
                let error = json!({"code": code::INTERNAL_ERROR,
                    "message": format!("{detail} ({})", code.as_str()),
                    "data": {"oncely": code.as_str(), "status": code.status().as_u16()}});
                vec![jsonrpc::error_value(&id, error)]
            }
            Reply::Server {
                answer,
                edit,
                cancel,
                ..
            } => {
                let whole = read_whole(answer.body);
                let bytes = match cancel {
                    Some(cancel) => tokio::select! {
                        bytes = whole => bytes,
                        () = cancel => return Vec::new(),
                    },
                    None => whole.await,
                };
                let bytes = match bytes {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        tracing::warn!(error = %e, "the answer broke off");
                        return Vec::new();
                    }
                };
                let mut messages = messages_in(answer.framing, &bytes);
                if let Some(mut edit) = edit {
                    for message in &mut messages {
                        edit(message);
                    }
                }
                messages
            }
        };
        if batch && messages.len() > 1 {
            return vec![Value::Array(messages)];
        }
        messages
    }
}

/// A whole body.
async fn read_whole(mut body: BodyStream) -> Result<Vec<u8>, crate::BoxError> {
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

/// A whole body of at most `limit` bytes; `None` when it is larger or breaks off.
async fn read_limited(mut body: BodyStream, limit: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.ok()?;
        if out.len() + chunk.len() > limit {
            return None;
        }
        out.extend_from_slice(&chunk);
    }
    Some(out)
}

/// The JSON-RPC messages of a whole answer body: one message, a batch, or an event stream.
pub fn messages_in(framing: Framing, body: &[u8]) -> Vec<Value> {
    match framing {
        Framing::Nothing => Vec::new(),
        Framing::EventStream => {
            let mut parser = sse::Parser::new(body.len() + 1);
            let mut events = parser.feed(body);
            events.extend(parser.feed(b"\n\n"));
            events
                .iter()
                .filter_map(|e| jsonrpc::parse(e.data.as_bytes()))
                .collect()
        }
        // `jsonrpc::parse`: an answer with a number serde_json refuses (`1e400`) is still
        // one (that number read as its canonical text), not an answer without a response.
        Framing::Json => match jsonrpc::parse(body) {
            Some(Value::Array(items)) => items,
            Some(v) => vec![v],
            None => Vec::new(),
        },
    }
}

/// One endpoint's core: its config, the engine, the server, the tool catalog and the
/// guarded calls in flight by session. Cheap to share (`Arc`).
pub struct Core<S: Server> {
    shared: Arc<Shared>,
    server: S,
    sessions: Arc<Sessions>,
}

impl<S: Server> std::ops::Deref for Core<S> {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl<S: Server> Core<S> {
    /// The core of an endpoint of `config` on `guard`, reaching the MCP server through
    /// `server`.
    pub fn new(config: McpConfig, guard: Arc<Guard>, server: S) -> Arc<Core<S>> {
        Arc::new(Core {
            shared: Arc::new(Shared {
                config,
                guard,
                catalog: ToolCatalog::new(),
            }),
            server,
            sessions: Arc::new(Sessions::new()),
        })
    }

    /// The endpoint's config.
    pub fn config(&self) -> &McpConfig {
        &self.config
    }

    /// What the core has learned about the server's tools.
    pub fn catalog(&self) -> &ToolCatalog {
        &self.catalog
    }

    /// The server.
    pub fn server(&self) -> &S {
        &self.server
    }

    /// Whether guarded calls this core owns run on `session`.
    pub fn owns_calls_on(&self, session: &str) -> bool {
        self.sessions.owns_calls_on(session)
    }

    /// Resolves once the guarded calls this core owns on `session` are done and recorded,
    /// or at `deadline`.
    pub async fn owned_calls_done(&self, session: &str, deadline: Instant) {
        self.sessions.owned_calls_done(session, deadline).await
    }

    /// Answers one message (or batch), `bytes` as it was written.
    pub async fn handle(
        self: &Arc<Self>,
        bytes: Bytes,
        context: Context<S::Origin>,
    ) -> Reply<S::Head> {
        let mut edits = Vec::new();
        match jsonrpc::parse(&bytes) {
            Some(message @ Value::Object(_)) => {
                if let Some(target) = jsonrpc::cancelled_request_id(&message) {
                    if self
                        .sessions
                        .is_guarded_in_flight(&context.session, &target)
                    {
                        tracing::info!(route = %self.config.path, request_id = %target,
                            "dropped a cancellation of a guarded tools/call: the call runs to its end");
                        return Reply::Accepted;
                    }
                }
                let text = std::str::from_utf8(&bytes).unwrap_or_default();
                if let Some(refusal) = unreadable_call(&message, text) {
                    return Reply::Refused(refusal);
                }
                if let Some(request) = jsonrpc::as_request(&message) {
                    match request.method {
                        "tools/call" => {
                            if let Some(call) = read_call(self, &context, &message, text) {
                                return self.clone().guard(bytes, call, &context).await;
                            }
                        }
                        "tools/list" => edits.push((request.id.clone(), AnswerEdit::ToolsList)),
                        "server/discover" => {
                            edits.push((request.id.clone(), AnswerEdit::Discover));
                        }
                        method if method.starts_with("tasks/") && context.modern => {
                            return self.task_request(bytes, &message, &context).await;
                        }
                        _ => {}
                    }
                }
            }
            Some(Value::Array(items)) => return self.clone().batch(bytes, items, context).await,
            _ => {}
        }
        self.forward(bytes, &context, edits).await
    }

    /// Sends the message on unchanged; the answers to the requests `edits` names are
    /// edited on the way (see [`AnswerEdit`]).
    pub(crate) async fn forward(
        self: &Arc<Self>,
        bytes: Bytes,
        context: &Context<S::Origin>,
        edits: Vec<(Value, AnswerEdit)>,
    ) -> Reply<S::Head> {
        let id = jsonrpc::parse(&bytes)
            .as_ref()
            .and_then(jsonrpc::as_request)
            .map(|r| r.id.clone());
        let sent = self.server.send(Outgoing {
            bytes,
            origin: &context.origin,
            owner: false,
            span: None,
        });
        match sent.await {
            Ok(answer) => {
                let edit = (!edits.is_empty() && answer.refused.is_none())
                    .then(|| edit::editor(self.shared.clone(), edits));
                Reply::Server {
                    answer,
                    edit,
                    mark: None,
                    cancel: None,
                }
            }
            Err(e) => {
                tracing::warn!(route = %self.config.path, error = %e, "upstream unreachable");
                Reply::failed(
                    id.as_ref(),
                    ProblemCode::UpstreamUnreachable,
                    "the MCP server could not be reached",
                )
            }
        }
    }

    /// `tasks/get`, `tasks/cancel` or `tasks/update` of the 2026-07-28 extension: this
    /// endpoint's tasks (`rec_…`) are answered from the ledger, any other task id is the
    /// server's own and is sent on (see [`task_requests::answer`]).
    async fn task_request(
        self: &Arc<Self>,
        bytes: Bytes,
        message: &Value,
        context: &Context<S::Origin>,
    ) -> Reply<S::Head> {
        let Some(request) = jsonrpc::as_request(message) else {
            return self.forward(bytes, context, Vec::new()).await;
        };
        let principal = || {
            context
                .caller
                .facts(&self.guard, &self.config, &self.config.path)
                .principal
        };
        match task_requests::answer(self, &request, principal).await {
            TaskAnswer::Answered(message) => Reply::Message(message, None),
            TaskAnswer::Refused(message) => Reply::Refused(message),
            TaskAnswer::Forward => {
                let id = request.id.clone();
                self.forward_task_request(bytes, context, id).await
            }
        }
    }

    /// A `tasks/*` request naming a task that is not one of oncely's: the server's own.
    /// Its answer passes back, except that a server that does not know the task, or does
    /// not serve the extension at all (its transport serves no such message, or JSON-RPC
    /// -32601), is answered -32602 as the extension requires.
    async fn forward_task_request(
        self: &Arc<Self>,
        bytes: Bytes,
        context: &Context<S::Origin>,
        id: Value,
    ) -> Reply<S::Head> {
        let answer = match self.forward(bytes, context, Vec::new()).await {
            Reply::Server { answer, .. } => answer,
            other => return other,
        };
        let not_served = answer.refused.as_ref().is_some_and(|r| r.not_served);
        let (head, framing, refused) = (answer.head, answer.framing, answer.refused);
        let Some(bytes) = read_limited(answer.body, edit::EDIT_LIMIT).await else {
            return Reply::Message(
                jsonrpc::error_message(
                    &id,
                    code::INTERNAL_ERROR,
                    "the MCP server's answer broke off",
                ),
                None,
            );
        };
        let unknown_method = messages_in(framing, &bytes).iter().any(|m| {
            matches!(jsonrpc::response_to(m, &id), Some(jsonrpc::Outcome::Error(e)) if e.get("code") == Some(&json!(code::METHOD_NOT_FOUND)))
        });
        if unknown_method || not_served {
            return Reply::Message(task_requests::task_not_found(&id, "Task not found"), None);
        }
        let mut answer = ServerAnswer::json(head, framing, bytes.into());
        answer.refused = refused;
        Reply::Server {
            answer,
            edit: None,
            mark: None,
            cancel: None,
        }
    }
}
