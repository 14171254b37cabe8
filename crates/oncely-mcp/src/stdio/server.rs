//! The real MCP server over stdio, as the core's server ([`ServerLink`], a
//! [`MessageServer`]): what the core sends on is written to the server's standard input, one message per line,
//! each request under an id of the link's own, and the server's answer to it is handed
//! back under the id its client gave. The server's own messages (its requests to the
//! client, such as sampling, and its notifications) go to the client as they are.
//!
//! Renumbering keeps the two sides' ids apart: a client may reuse an id whose call the
//! link still runs (a guarded call outlives its client's interest), and a replayed
//! answer is written under the client's id without any request reaching the server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use oncely_tower::UpstreamError;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::lines::{Line, LineReader};
use crate::core::MessageServer;
use crate::jsonrpc;
use crate::jsonrpc::code;

/// A line to write to one side.
pub(crate) type Lines = mpsc::UnboundedSender<Vec<u8>>;

/// Most bytes of the server's notifications waiting for a client that does not read
/// them; past it they are dropped (said once), so that a host that stops reading cannot
/// make the wrapper grow without bound. Answers and the server's requests are never
/// dropped: they are what the calls in flight wait for.
pub(crate) const MAX_QUEUED_NOTIFICATIONS: usize = 64 << 20;

/// The lines to the client, and how many bytes of them wait to be written.
#[derive(Clone)]
pub(crate) struct ToClient {
    lines: Lines,
    queued: Arc<Queued>,
}

/// How many bytes of lines to the client wait to be written.
#[derive(Default)]
pub(crate) struct Queued {
    bytes: AtomicU64,
    /// Notifications are being dropped (said once per episode).
    dropping: AtomicBool,
}

impl Queued {
    /// A line of `len` bytes was written (or dropped by the writer).
    pub(crate) fn written(&self, len: usize) {
        let left = self.bytes.fetch_sub(len as u64, Ordering::Relaxed) - len as u64;
        if left == 0 {
            self.dropping.store(false, Ordering::Relaxed);
        }
    }
}

impl ToClient {
    /// Lines to the client through `lines`, counted in `queued` (which the writer
    /// tells what it wrote).
    pub(crate) fn new(lines: Lines, queued: Arc<Queued>) -> ToClient {
        ToClient { lines, queued }
    }

    /// Queues a line that must reach the client (an answer, a server's request).
    pub(crate) fn send(&self, line: Vec<u8>) {
        self.queued
            .bytes
            .fetch_add(line.len() as u64, Ordering::Relaxed);
        let _ = self.lines.send(line);
    }

    /// Queues a notification of the server's, unless too many bytes wait already.
    pub(crate) fn notify(&self, line: Vec<u8>) {
        if self.queued.bytes.load(Ordering::Relaxed) > MAX_QUEUED_NOTIFICATIONS as u64 {
            if !self.queued.dropping.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the host does not read its input: the MCP server's notifications are \
                     dropped until it does"
                );
            }
            return;
        }
        self.send(line);
    }
}

/// What a request sent to the server is waiting for.
enum Awaited {
    /// The server's response, under the client's id again.
    Response(Vec<u8>),
    /// The client cancelled the request: it gets no answer.
    Cancelled,
}

/// A request sent to the server and not answered yet.
struct Waiting {
    answer: oneshot::Sender<Awaited>,
    /// The id the client gave it (JSON text).
    client_id: String,
}

/// The link to the server: its standard input, the requests waiting for its answers.
pub(crate) struct ServerLink {
    to_server: Lines,
    to_client: ToClient,
    next_id: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiting>>,
    /// The link's id of each request forwarded unguarded, by the client's id: a
    /// cancellation of it is passed on under the link's id. A guarded call's owner is not
    /// here: nothing the client sends stops it.
    forwarded: Mutex<HashMap<String, u64>>,
    /// The server's standard output has ended: nothing more will be answered.
    closed: AtomicBool,
    /// The client has gone (its input ended): the server's requests to it are answered
    /// with an error here, so that a call waiting for one ends.
    client_gone: AtomicBool,
    /// Lines the server wrote that were not JSON-RPC messages.
    junk: AtomicU64,
}

impl ServerLink {
    pub(crate) fn new(to_server: Lines, to_client: ToClient) -> Arc<ServerLink> {
        Arc::new(ServerLink {
            to_server,
            to_client,
            next_id: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
            forwarded: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            client_gone: AtomicBool::new(false),
            junk: AtomicU64::new(0),
        })
    }

    /// The client has gone: nothing the server asks of it will be answered by it.
    pub(crate) fn client_gone(&self) {
        self.client_gone.store(true, Ordering::SeqCst);
    }

    /// How many lines the server wrote that were not JSON-RPC.
    pub(crate) fn junk_lines(&self) -> u64 {
        self.junk.load(Ordering::Relaxed)
    }

    /// Sends one message; for a request, waits for the server's response (`None` for
    /// anything else, and for a request its client cancelled).
    async fn send_message(
        self: Arc<Self>,
        text: String,
        owner: bool,
    ) -> Result<Option<Vec<u8>>, UpstreamError> {
        let value: Option<Value> = jsonrpc::parse(text.as_bytes());
        let request = value
            .as_ref()
            .and_then(jsonrpc::as_request)
            .map(|r| r.id.clone());
        let Some(client_id) = request else {
            let text = match value.as_ref().and_then(jsonrpc::cancelled_request_id) {
                Some(target) => match self.cancel(&target) {
                    Some(ours) => {
                        jsonrpc::with_cancelled_id(&text, &ours.to_string()).unwrap_or(text)
                    }
                    // Not one of the requests the server runs for this client: the
                    // server would not know the id.
                    None => return Ok(None),
                },
                None => text,
            };
            self.write(text.into_bytes())?;
            return Ok(None);
        };
        if self.closed.load(Ordering::SeqCst) {
            return Err(UpstreamError::BeforeSend(
                "the MCP server has exited".into(),
            ));
        }
        let ours = self.next_id.fetch_add(1, Ordering::Relaxed);
        let client_text = jsonrpc::id_text(&client_id);
        let (tx, rx) = oneshot::channel();
        self.lock_waiting().insert(
            ours,
            Waiting {
                answer: tx,
                client_id: client_text.clone(),
            },
        );
        if !owner {
            self.lock_forwarded().insert(client_text.clone(), ours);
        }
        // Dropped unanswered (the owner's timeout, a client gone): the entries go, and
        // the server is told that nobody waits for the request any more.
        let pending = Pending {
            link: self.clone(),
            ours,
            client: (!owner).then_some(client_text),
            answered: false,
        };
        let line = jsonrpc::with_id(&text, &ours.to_string()).ok_or_else(|| {
            UpstreamError::BeforeSend("the request is not a JSON object".to_string())
        })?;
        self.write(line.into_bytes())?;
        let answer = rx.await;
        let mut pending = pending;
        pending.answered = true;
        match answer {
            Ok(Awaited::Response(bytes)) => Ok(Some(bytes)),
            Ok(Awaited::Cancelled) => Ok(None),
            Err(_) => Err(UpstreamError::AfterSend(
                "the MCP server exited before it answered".into(),
            )),
        }
    }

    /// Writes a line to the server.
    fn write(&self, line: Vec<u8>) -> Result<(), UpstreamError> {
        self.to_server
            .send(line)
            .map_err(|_| UpstreamError::BeforeSend("the MCP server's input is closed".into()))
    }

    /// The link's id of the client's request `client_id` forwarded unguarded and still
    /// waiting, which then gets no answer (its client cancelled it).
    fn cancel(&self, client_id: &str) -> Option<u64> {
        let ours = self.lock_forwarded().remove(client_id)?;
        if let Some(w) = self.lock_waiting().remove(&ours) {
            let _ = w.answer.send(Awaited::Cancelled);
        }
        Some(ours)
    }

    /// Reads the server's standard output to its end: answers to the link's requests go
    /// to who waits for them, everything else to the client. Lines that are not JSON are
    /// reported once and dropped.
    pub(crate) async fn read_from<R>(self: Arc<Self>, reader: R, limit: usize)
    where
        R: tokio::io::AsyncBufRead + Unpin,
    {
        let mut lines = LineReader::new(reader, limit);
        loop {
            let line = match lines.next().await {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the MCP server's output failed");
                    break;
                }
            };
            match line {
                Line::Whole(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {}
                Line::Whole(bytes) => self.line_from_server(bytes),
                Line::TooLong { len, id } => {
                    tracing::warn!(
                        bytes = len,
                        limit,
                        "the MCP server wrote a message over the limit; it was dropped"
                    );
                    if let Some(ours) = id.as_ref().and_then(Value::as_u64) {
                        // Its waiter learns the server answered something it cannot have.
                        self.lock_waiting().remove(&ours);
                    }
                }
            }
        }
        self.closed.store(true, Ordering::SeqCst);
        // Nobody will answer what still waits.
        self.lock_waiting().clear();
    }

    /// One line the server wrote (read once: a message, each of a batch, or junk).
    fn line_from_server(&self, bytes: Vec<u8>) {
        match jsonrpc::parse(&bytes) {
            None => self.junk(&bytes),
            Some(Value::Array(values)) => {
                let text = std::str::from_utf8(&bytes).unwrap_or_default();
                let texts = jsonrpc::batch_texts(text).unwrap_or_default();
                for (value, text) in values.into_iter().zip(texts) {
                    self.message_from_server(text.as_bytes().to_vec(), value);
                }
            }
            Some(value) => self.message_from_server(bytes, value),
        }
    }

    /// One message the server wrote (`bytes` as written, `value` as read): a response to
    /// one of the link's requests goes back under its client's id; anything else goes to
    /// the client as it is.
    fn message_from_server(&self, bytes: Vec<u8>, value: Value) {
        let is_response = value.get("method").is_none()
            && (value.get("result").is_some() || value.get("error").is_some());
        if is_response {
            let ours = value.get("id").and_then(Value::as_u64);
            let waiting = ours.and_then(|id| self.lock_waiting().remove(&id));
            if let Some(w) = waiting {
                self.lock_forwarded().remove(&w.client_id);
                let text = std::str::from_utf8(&bytes).unwrap_or_default();
                let answer = jsonrpc::with_id(text, &w.client_id)
                    .map(String::into_bytes)
                    .unwrap_or(bytes);
                let _ = w.answer.send(Awaited::Response(answer));
                return;
            }
            // An answer to a request nobody waits for any more (cancelled, timed out).
            tracing::debug!(id = ?ours, "an answer nobody waits for was dropped");
            return;
        }
        let request_id = jsonrpc::as_request(&value).map(|r| r.id.clone());
        if let (Some(id), true) = (&request_id, self.client_gone.load(Ordering::SeqCst)) {
            let refusal = jsonrpc::error_message(id, code::INTERNAL_ERROR, "the client has gone");
            let _ = self.write(refusal.to_string().into_bytes());
            return;
        }
        if request_id.is_some() {
            self.to_client.send(bytes);
        } else {
            self.to_client.notify(bytes);
        }
    }

    /// A line that is not JSON-RPC: said once, then only counted.
    fn junk(&self, bytes: &[u8]) {
        if self.junk.fetch_add(1, Ordering::Relaxed) == 0 {
            let start: String = String::from_utf8_lossy(&bytes[..bytes.len().min(80)]).into();
            tracing::warn!(line = %start,
                "the MCP server wrote a line to its standard output that is not a JSON-RPC \
                 message; it was dropped (a stdio server must write only JSON-RPC there, and \
                 its logs to standard error); later ones are dropped without a word");
        }
    }

    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_forwarded(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.forwarded.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A request sent and waited for; dropped unanswered, it leaves the link, and the server
/// is told (`notifications/cancelled`) that nobody waits for it.
struct Pending {
    link: Arc<ServerLink>,
    ours: u64,
    client: Option<String>,
    answered: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(client) = &self.client {
            let mut forwarded = self.link.lock_forwarded();
            if forwarded.get(client) == Some(&self.ours) {
                forwarded.remove(client);
            }
        }
        if self.answered {
            return;
        }
        if self.link.lock_waiting().remove(&self.ours).is_some() {
            let cancel = serde_json::json!({
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": self.ours, "reason": "nobody waits for the answer any more"},
            });
            let _ = self.link.write(cancel.to_string().into_bytes());
        }
    }
}

impl MessageServer for ServerLink {
    fn send_one(
        self: Arc<Self>,
        text: String,
        owner: bool,
    ) -> BoxFuture<'static, Result<Option<Vec<u8>>, UpstreamError>> {
        Box::pin(self.send_message(text, owner))
    }
}
