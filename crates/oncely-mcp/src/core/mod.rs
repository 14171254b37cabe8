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
//! - `server`: the [`Server`] trait, its answer (and how its body is read), and
//!   [`Messages`] (a server answering each message with one response, as the stdio child
//!   and the remote link do). `reply`: the [`Reply`] a message gets, and its [`Mark`].
//! - `message_span`: the server span of every message (traces on), ended with its answer.
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
mod made_keys;
mod message_span;
mod reply;
mod results;
pub(crate) mod server;
mod server_task;
mod sessions;
mod shared;
mod task_requests;

use std::sync::Arc;

use bytes::Bytes;
use oncely_http::problem::ProblemCode;
use oncely_tower::Guard;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::catalog::ToolCatalog;
use crate::config::McpConfig;
use crate::jsonrpc;
use crate::jsonrpc::code;
use call::read_call;
pub(crate) use call::unreadable_call;
use edit::AnswerEdit;
use message_span::MessageSpan;
use oncely_tower::trace::SpanParent;
use sessions::Sessions;
use shared::Shared;
use task_requests::TaskAnswer;

pub use context::{Caller, Context, KnownCaller};
pub use reply::{Mark, Reply};

use server::read_limited;
pub use server::{
    messages_in, BodyStream, Framing, LedgerFacts, MessageServer, Messages, Outgoing, Refusal,
    Server, ServerAnswer,
};

/// Protocol revisions that use the initialize handshake and sessions; any later one is
/// the stateless era (2026-07-28), whose routing headers must match the body.
pub const HANDSHAKE_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Whether `revision` is of the stateless era (2026-07-28 or later): a revision without
/// the initialize handshake.
pub fn is_stateless(revision: &str) -> bool {
    !HANDSHAKE_VERSIONS.contains(&revision)
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
                made_keys: Default::default(),
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

    /// Answers one message (or batch), `bytes` as it was written. A message is a server
    /// span when traces are on ([`MessageSpan`]): a guarded call's, ended by the engine,
    /// or any other's, ended with its answer.
    pub async fn handle(
        self: &Arc<Self>,
        bytes: Bytes,
        context: Context<S::Origin>,
    ) -> Reply<S::Head> {
        let message = match jsonrpc::parse(&bytes) {
            Some(message @ Value::Object(_)) => message,
            Some(Value::Array(items)) => return self.clone().batch(bytes, items, context).await,
            _ => return self.forward(bytes, &context, None, Vec::new(), None).await,
        };
        let mut span = MessageSpan::start(self, &context, &message);
        let text = std::str::from_utf8(&bytes).unwrap_or_default();
        // A `tools/call` that cannot be read as one call to guard is refused, so that no
        // spelling of a call passes unguarded.
        if let Some(refusal) = unreadable_call(&message, text) {
            return message_span::finish(span.into_iter().collect(), Reply::Refused(refusal));
        }
        let call = jsonrpc::as_request(&message)
            .filter(|r| r.method == "tools/call")
            .and_then(|_| read_call(self, &context, &message, text, &mut span));
        if let Some(call) = call {
            return self.clone().guard(bytes, call, &context).await;
        }
        let reply = self.message(bytes, &message, &context, span.as_ref()).await;
        message_span::finish(span.into_iter().collect(), reply)
    }

    /// Answers one message that is not a guarded call (nor one refused as unreadable).
    async fn message(
        self: &Arc<Self>,
        bytes: Bytes,
        message: &Value,
        context: &Context<S::Origin>,
        span: Option<&MessageSpan>,
    ) -> Reply<S::Head> {
        if let Some(target) = jsonrpc::cancelled_request_id(message) {
            if self
                .sessions
                .is_guarded_in_flight(&context.session, &target)
            {
                tracing::info!(route = %self.config.path, request_id = %target,
                    "dropped a cancellation of a guarded tools/call: the call runs to its end");
                return Reply::Accepted;
            }
        }
        let mut edits = Vec::new();
        let request = jsonrpc::as_request(message);
        if let Some(request) = &request {
            match request.method {
                "tools/list" => edits.push((request.id.clone(), AnswerEdit::ToolsList)),
                "server/discover" => edits.push((request.id.clone(), AnswerEdit::Discover)),
                method if method.starts_with("tasks/") && context.modern => {
                    return self.task_request(bytes, message, context, span).await;
                }
                _ => {}
            }
        }
        let id = request.map(|r| r.id);
        self.forward(bytes, context, id, edits, span.map(MessageSpan::parent))
            .await
    }

    /// Sends the message on unchanged; the answers to the requests `edits` names are
    /// edited on the way (see [`AnswerEdit`]). `id` is the request's (a failure answers
    /// it), `span` the span its upstream call is a child of.
    pub(crate) async fn forward(
        self: &Arc<Self>,
        bytes: Bytes,
        context: &Context<S::Origin>,
        id: Option<&Value>,
        edits: Vec<(Value, AnswerEdit)>,
        span: Option<SpanParent>,
    ) -> Reply<S::Head> {
        let sent = self.server.send(Outgoing {
            bytes,
            origin: &context.origin,
            owner: false,
            span,
            own: false,
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
                    id,
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
        span: Option<&MessageSpan>,
    ) -> Reply<S::Head> {
        let parent = span.map(MessageSpan::parent);
        let Some(request) = jsonrpc::as_request(message) else {
            return self.forward(bytes, context, None, Vec::new(), parent).await;
        };
        let principal = || context.caller.facts(&self.guard, &self.config).principal;
        match task_requests::answer(self, &request, principal).await {
            TaskAnswer::Answered(message) => Reply::Message(message, None),
            TaskAnswer::Refused(message) => Reply::Refused(message),
            TaskAnswer::Forward => {
                let id = request.id.clone();
                self.forward_task_request(bytes, context, id, parent).await
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
        span: Option<SpanParent>,
    ) -> Reply<S::Head> {
        let answer = match self
            .forward(bytes, context, Some(&id), Vec::new(), span)
            .await
        {
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
