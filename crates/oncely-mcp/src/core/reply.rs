//! What the core answers a message with ([`Reply`]), and how oncely marks the answer it
//! gives for a guarded call ([`Mark`]).

use oncely_core::Record;
use oncely_http::problem::ProblemCode;
use serde_json::{json, Value};

use super::edit;
use super::server::ServerAnswer;
use super::server::{messages_in, read_whole};
use crate::jsonrpc;
use crate::jsonrpc::code;
use futures::future::BoxFuture;

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
    pub(super) fn of(status: Option<&'static str>, record: &Record) -> Mark {
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
    pub(super) fn failed(id: Option<&Value>, code: ProblemCode, detail: &str) -> Reply<H> {
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
