//! The server side of the core: the one thing a transport gives the core to reach the MCP
//! server ([`Server`]), what the server answers ([`ServerAnswer`]), and the servers that
//! answer each message with at most its one response ([`MessageServer`]: a child over
//! stdio, a remote link), made a [`Server`] once for both ([`Messages`]).

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::StreamExt;
use oncely_tower::trace::SpanParent;
use oncely_tower::UpstreamError;

use serde_json::Value;

use crate::jsonrpc;
use crate::sse;

/// A stream of an answer's bytes, as the engine streams and records it.
pub use oncely_engine::BodyStream;

/// How an answer's bytes hold its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One JSON-RPC message or a batch (a JSON array).
    Json,
    /// Server-Sent Events, each `data` a message.
    EventStream,
    /// Nothing to read: the server took the message and answers nothing (a notification,
    /// a response, HTTP's 202).
    Nothing,
}

/// What the server answered one message (or batch) with.
pub struct ServerAnswer<H> {
    /// What only the transport reads of the answer (HTTP: its status and headers); the
    /// core hands it back untouched with the body.
    pub head: H,
    /// How the body holds the messages.
    pub framing: Framing,
    /// The body, streamed.
    pub body: BodyStream,
    /// The server's transport refused the message without answering it in JSON-RPC (an
    /// HTTP error status): why, and whether it is because it serves no such message
    /// (HTTP 404, 405, 501). `None` for a transport that answers every message in
    /// JSON-RPC.
    pub refused: Option<Refusal>,
    /// What the transport read of its answer for the ledger.
    pub ledger: LedgerFacts,
}

/// Why a server's transport refused a message (see [`ServerAnswer::refused`]).
#[derive(Debug, Clone)]
pub struct Refusal {
    /// What the refusal said (`HTTP 500`).
    pub reason: String,
    /// The server serves no such message (HTTP 404, 405, 501).
    pub not_served: bool,
    /// The transport's own code for it (HTTP's status), which the ledger records.
    pub status: u16,
}

/// What a transport reads of an answer that the ledger keeps (HTTP: the replay window
/// the server asked for, its request id, the declared length, the headers a replay
/// carries); all empty for a transport that carries none of it.
pub use oncely_tower::AnswerFacts as LedgerFacts;

impl<H> ServerAnswer<H> {
    /// An answer with nothing to read.
    pub fn nothing(head: H) -> ServerAnswer<H> {
        ServerAnswer::json(head, Framing::Nothing, Bytes::new())
    }

    /// A whole answer of `bytes`, framed as `framing`.
    pub fn json(head: H, framing: Framing, bytes: Bytes) -> ServerAnswer<H> {
        ServerAnswer {
            head,
            framing,
            body: Box::pin(futures::stream::once(async move { Ok(bytes) })),
            refused: None,
            ledger: LedgerFacts::default(),
        }
    }
}

/// One message on its way to the server.
pub struct Outgoing<'a, O> {
    /// The message (or batch) as it is sent.
    pub bytes: Bytes,
    /// What the transport knows of where the message came from (HTTP: the request head).
    pub origin: &'a O,
    /// The message is a guarded call's, sent by the owner task: nothing its client does
    /// reaches it, and the owner holds the slot and times it.
    pub owner: bool,
    /// The span the call's upstream span is a child of (traces on, owner calls).
    pub span: Option<SpanParent>,
    /// The message is oncely's own, not its client's (the owner following the server's
    /// task: `tasks/get`, `tasks/result`), sent where the client's call went (HTTP: with
    /// its headers, the routing ones made the message's).
    pub own: bool,
}

/// The MCP server, as the core reaches it: one message in, its answer out.
pub trait Server: Send + Sync + 'static {
    /// What a transport knows of a message that its server needs to send it on (HTTP:
    /// the client's request head); `()` for transports that need nothing.
    type Origin: Clone + Send + Sync + 'static;
    /// What only the transport reads of an answer (HTTP: its status and headers).
    type Head: Send + 'static;

    /// Sends one message (or batch) and returns the server's answer as it begins, or why
    /// it could not be sent ([`UpstreamError::BeforeSend`]) or broke off before it began.
    fn send(
        &self,
        message: Outgoing<'_, Self::Origin>,
    ) -> BoxFuture<'static, Result<ServerAnswer<Self::Head>, UpstreamError>>;

    /// Makes `head` fit another body than the one it came with (the owner answers a call
    /// the server ran as a task with the task's result: HTTP drops `Content-Length`).
    fn body_replaced(_head: &mut Self::Head) {}
}

/// A server that answers each message with at most its one response, as a JSON-RPC
/// peer on a stream does (a child over stdio, a remote link that reads its own answers).
pub trait MessageServer: Send + Sync + 'static {
    /// Sends one message; for a request, waits for the server's response (`None` for
    /// anything else, and for a request its client cancelled).
    fn send_one(
        self: Arc<Self>,
        text: String,
        owner: bool,
    ) -> BoxFuture<'static, Result<Option<Vec<u8>>, UpstreamError>>;
}

/// A [`MessageServer`] as the core's [`Server`]: a batch is sent message by message and
/// its responses joined into one batch.
pub struct Messages<M>(pub Arc<M>);

impl<M> Clone for Messages<M> {
    fn clone(&self) -> Self {
        Messages(self.0.clone())
    }
}

impl<M: MessageServer> Server for Messages<M> {
    type Origin = ();
    type Head = ();

    fn send(
        &self,
        message: Outgoing<'_, ()>,
    ) -> BoxFuture<'static, Result<ServerAnswer<()>, UpstreamError>> {
        let server = self.0.clone();
        let (bytes, owner) = (message.bytes, message.owner);
        // The client span, named by the message's method (a guarded call's id is the one
        // its `_meta.traceparent` names).
        let span = message.span.map(|p| {
            let name = method_of(&bytes).unwrap_or_else(|| "batch".into());
            let span = p.child(name, oncely_tower::trace::SpanKind::Client);
            oncely_tower::trace::ClientSpan::new(span)
        });
        Box::pin(async move {
            let text = std::str::from_utf8(&bytes)
                .map_err(|_| UpstreamError::BeforeSend("the message is not UTF-8".into()))?;
            let answer = match jsonrpc::batch_texts(text) {
                Some(items) => {
                    let sent = items
                        .into_iter()
                        .map(|item| server.clone().send_one(item.to_string(), owner));
                    let mut answers = Vec::new();
                    for answer in futures::future::join_all(sent).await {
                        answers.extend(answer?);
                    }
                    (!answers.is_empty()).then(|| {
                        let mut batch = b"[".to_vec();
                        batch.extend(answers.join(&b","[..]));
                        batch.push(b']');
                        batch
                    })
                }
                None => server.send_one(text.to_string(), owner).await?,
            };
            if let Some(span) = span {
                span.ended();
            }
            Ok(match answer {
                Some(body) => ServerAnswer::json((), Framing::Json, body.into()),
                None => ServerAnswer::nothing(()),
            })
        })
    }
}

/// The `method` of one JSON-RPC message, read without the rest of it.
fn method_of(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    let m: Method<'_> = serde_json::from_slice(bytes).ok()?;
    m.method.map(|m| m.into_owned())
}

/// A whole body.
pub(super) async fn read_whole(mut body: BodyStream) -> Result<Vec<u8>, crate::BoxError> {
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

/// A whole body of at most `limit` bytes; `None` when it is larger or breaks off.
pub(super) async fn read_limited(mut body: BodyStream, limit: usize) -> Option<Vec<u8>> {
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
