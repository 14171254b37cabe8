//! The server span of every MCP message the core answers (the GenAI conventions' `mcp`
//! model): started when the message is read, named `{mcp.method.name} {target}`, and
//! ended with its answer, whoever gives it. A guarded `tools/call` takes it over
//! (`call`), and the engine ends it with the call's outcome. For anything else
//! [`MessageSpan::finish`] ends it: at once for an answer oncely writes, and for the
//! server's answer once that answer's response to the request has passed (or the
//! answer ended without one), read on the way without changing a byte of it.

use futures::StreamExt;
use oncely_tower::trace::{attr, McpRequest, Span, SpanParent};
use serde_json::Value;

use super::context::Context;
use super::server::{BodyStream, Framing};
use super::shared::Shared;
use super::Reply;
use crate::sse;

/// `gen_ai.prompt.name`: the prompt of a `prompts/get`.
const PROMPT: &str = "gen_ai.prompt.name";

/// The span of one message, with the id its response answers.
pub(super) struct MessageSpan {
    span: Span,
    /// The request's id (`None` for a notification: nothing answers it).
    id: Option<Value>,
}

impl MessageSpan {
    /// The span of `message` (a request or a notification), when traces are on.
    pub(super) fn start<O>(
        core: &Shared,
        context: &Context<O>,
        message: &Value,
    ) -> Option<MessageSpan> {
        let method = message.get("method")?.as_str()?;
        let mut span = context.caller.span(&core.guard)?;
        let params = message.get("params");
        let id = message.get("id").filter(|id| !id.is_null());
        let name = params.and_then(|p| p.get("name")).and_then(Value::as_str);
        let target = match method {
            "tools/call" | "prompts/get" => name,
            _ => None,
        };
        let request = McpRequest {
            method,
            target,
            id,
            revision: context.caller.revision(),
            // The session only where the protocol has one (Streamable HTTP before
            // 2026-07-28), not oncely's own id of a stdio host.
            session: context
                .session
                .as_deref()
                .filter(|_| !context.modern && context.caller.transport() == "tcp"),
            transport: context.caller.transport(),
            meta: params.and_then(|p| p.get("_meta")),
        };
        oncely_tower::trace::mcp_server_request(&mut span, &request);
        if let (Some(prompt), "prompts/get") = (name, method) {
            span.set(PROMPT, prompt);
        }
        Some(MessageSpan {
            span,
            id: id.cloned(),
        })
    }

    /// The span of a guarded call (`span`), to be ended with the response to `id`.
    pub(super) fn of(span: Span, id: Value) -> MessageSpan {
        MessageSpan { span, id: Some(id) }
    }

    /// The span itself (a guarded call's, which the engine ends).
    pub(super) fn into_span(self) -> Span {
        self.span
    }

    /// Where the message's upstream call is a child.
    pub(super) fn parent(&self) -> SpanParent {
        self.span.as_parent()
    }

    /// Ends the span with the first response to its request among `messages` (each a
    /// message or a batch): a JSON-RPC error's code, or `tool_error` for a result with
    /// `isError`. A span without one ends as it is.
    fn answered(mut self, messages: &[Value]) {
        let response = self.id.as_ref().and_then(|id| {
            messages
                .iter()
                .flat_map(|m| match m {
                    Value::Array(items) => items.as_slice(),
                    one => std::slice::from_ref(one),
                })
                .find(|m| m.get("method").is_none() && m.get("id") == Some(id))
        });
        if let Some(response) = response {
            if let Some(error) = response.get("error") {
                let code = error
                    .get("code")
                    .map_or_else(|| "_OTHER".to_string(), Value::to_string);
                self.span.set(attr::RPC_STATUS, code.clone());
                self.span.set(attr::ERROR_TYPE, code);
                let message = error.get("message").and_then(Value::as_str).unwrap_or("");
                self.span.fail(message.to_string());
            } else if response.pointer("/result/isError") == Some(&Value::Bool(true)) {
                self.span.set(attr::ERROR_TYPE, "tool_error");
                self.span.fail("tool_error");
            }
        }
        self.span.end();
    }
}

/// Ends `spans` (the messages `reply` answers) with it and gives the reply back: an
/// answer oncely writes ends them now; the server's answer as each one's response passes
/// (read on the way, not a byte of it changed), or when it ends without one.
pub(super) fn finish<H>(mut spans: Vec<MessageSpan>, reply: Reply<H>) -> Reply<H> {
    if spans.is_empty() {
        return reply;
    }
    match reply {
        Reply::Message(message, mark) => {
            for span in spans {
                span.answered(std::slice::from_ref(&message));
            }
            Reply::Message(message, mark)
        }
        Reply::Refused(message) => {
            for span in spans {
                span.answered(std::slice::from_ref(&message));
            }
            Reply::Refused(message)
        }
        Reply::Failed { id, code, detail } => {
            for mut span in spans {
                span.span.set(attr::ERROR_TYPE, code.as_str());
                span.span.fail(detail.clone());
                span.span.end();
            }
            Reply::Failed { id, code, detail }
        }
        Reply::Server {
            mut answer,
            edit,
            mark,
            cancel,
        } => {
            if let Some(refused) = &answer.refused {
                for mut span in spans {
                    span.span.set(attr::ERROR_TYPE, refused.status.to_string());
                    span.span.fail(refused.reason.clone());
                    span.span.end();
                }
            } else {
                // A notification's span ends now: nothing answers it.
                let (answered, notices): (Vec<_>, Vec<_>) =
                    spans.drain(..).partition(|s| s.id.is_some());
                for span in notices {
                    span.answered(&[]);
                }
                if !answered.is_empty() {
                    let body =
                        std::mem::replace(&mut answer.body, Box::pin(futures::stream::empty()));
                    answer.body = watch(answered, body, answer.framing);
                }
            }
            Reply::Server {
                answer,
                edit,
                mark,
                cancel,
            }
        }
        reply @ (Reply::Accepted | Reply::Cancelled) => {
            for span in spans {
                span.answered(&[]);
            }
            reply
        }
    }
}

/// The most of an answer a span keeps to read its response from (a JSON body, or one
/// event): an error or an `isError` result is small; a larger answer ends its span
/// without reading it, and costs no copy of it.
const WATCH_LIMIT: usize = 64 << 10;

/// `body` passed on as it is, read on the way: each span ends once the response to its
/// request has passed, and the rest when the body ends (or is dropped). A JSON body over
/// [`WATCH_LIMIT`] is not read.
fn watch(spans: Vec<MessageSpan>, body: BodyStream, framing: Framing) -> BodyStream {
    let mut watcher = Watcher {
        spans,
        sse: (framing == Framing::EventStream).then(|| sse::Parser::new(WATCH_LIMIT)),
        held: Vec::new(),
        overflowed: false,
    };
    Box::pin(body.map(move |chunk| {
        if let Ok(bytes) = &chunk {
            watcher.feed(bytes);
        }
        chunk
    }))
}

/// Reads a streamed answer for the responses that end its spans.
struct Watcher {
    spans: Vec<MessageSpan>,
    sse: Option<sse::Parser>,
    held: Vec<u8>,
    /// The JSON body outgrew [`WATCH_LIMIT`]: its spans end with it, unread.
    overflowed: bool,
}

impl Watcher {
    fn feed(&mut self, bytes: &[u8]) {
        if self.spans.is_empty() || self.overflowed {
            return;
        }
        match &mut self.sse {
            Some(parser) => {
                let events = parser.feed(bytes);
                self.events(&events);
            }
            None if self.held.len() + bytes.len() > WATCH_LIMIT => {
                self.held = Vec::new();
                self.overflowed = true;
            }
            None => self.held.extend_from_slice(bytes),
        }
    }

    /// Ends the spans whose responses `events` hold.
    fn events(&mut self, events: &[sse::Event]) {
        for message in events
            .iter()
            .filter_map(|e| crate::jsonrpc::parse(e.data.as_bytes()))
        {
            let answers = |s: &MessageSpan| {
                message.get("method").is_none()
                    && s.id.is_some()
                    && message.get("id") == s.id.as_ref()
            };
            if let Some(at) = self.spans.iter().position(answers) {
                self.spans
                    .swap_remove(at)
                    .answered(std::slice::from_ref(&message));
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if self.spans.is_empty() {
            return;
        }
        let messages = match &mut self.sse {
            Some(parser) => {
                let events = parser.feed(b"\n\n");
                self.events(&events);
                Vec::new()
            }
            None => crate::jsonrpc::parse(&self.held).into_iter().collect(),
        };
        for span in self.spans.drain(..) {
            span.answered(&messages);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_tower::trace::{SpanData, SpanSink, Tracer};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Collect(Mutex<Vec<SpanData>>);

    impl SpanSink for Collect {
        fn submit(&self, span: SpanData) {
            self.0.lock().unwrap().push(span);
        }
    }

    fn span(sink: &Arc<Collect>, id: i64) -> MessageSpan {
        let tracer = Arc::new(Tracer::new(sink.clone(), 1.0));
        MessageSpan {
            span: tracer.start_request(&http::HeaderMap::new(), "tools/call x".into()),
            id: Some(Value::from(id)),
        }
    }

    /// Streams `chunks` through a watch of one span for request 7, and returns what it
    /// passed on and the span's `error.type`, once the body is dropped.
    async fn through(framing: Framing, chunks: Vec<&'static [u8]>) -> (Vec<u8>, Option<String>) {
        let sink = Arc::new(Collect::default());
        let body: BodyStream = Box::pin(futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, crate::BoxError>(bytes::Bytes::from_static(c))),
        ));
        let mut watched = watch(vec![span(&sink, 7)], body, framing);
        let mut passed = Vec::new();
        while let Some(chunk) = watched.next().await {
            passed.extend_from_slice(&chunk.unwrap());
        }
        drop(watched);
        let spans = sink.0.lock().unwrap().clone();
        assert_eq!(spans.len(), 1, "the span ends once");
        let error = spans[0]
            .attributes
            .iter()
            .find(|(k, _)| *k == attr::ERROR_TYPE)
            .map(|(_, v)| match v.text() {
                Some(s) => s.to_string(),
                None => format!("{v:?}"),
            });
        (passed, error)
    }

    #[tokio::test]
    async fn an_answer_passes_whole_and_its_response_ends_the_span() {
        let (passed, error) = through(
            Framing::Json,
            vec![
                b"{\"jsonrpc\":\"2.0\",\"id\":7,",
                b"\"error\":{\"code\":-32601,\"message\":\"no\"}}",
            ],
        )
        .await;
        assert_eq!(
            passed,
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32601,\"message\":\"no\"}}"
        );
        assert_eq!(error.as_deref(), Some("-32601"));

        let sse: &'static [u8] = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"isError\":true}}\n\n";
        let (passed, error) = through(Framing::EventStream, vec![&sse[..40], &sse[40..]]).await;
        assert_eq!(passed, sse, "the stream passes unchanged");
        assert_eq!(error.as_deref(), Some("tool_error"));

        // Another request's response does not end it; nothing but the body's end does.
        let (_, error) = through(
            Framing::Json,
            vec![b"{\"jsonrpc\":\"2.0\",\"id\":8,\"error\":{\"code\":1,\"message\":\"x\"}}"],
        )
        .await;
        assert_eq!(error, None);
    }

    #[tokio::test]
    async fn a_large_answer_passes_unread_and_uncopied() {
        static BIG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let big = BIG.get_or_init(|| {
            let mut v =
                b"{\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-1,\"message\":\"".to_vec();
            v.extend(std::iter::repeat_n(b'x', WATCH_LIMIT));
            v.extend_from_slice(b"\"}}");
            v
        });
        let (passed, error) = through(Framing::Json, vec![&big[..100], &big[100..]]).await;
        assert_eq!(&passed, big);
        assert_eq!(error, None, "over the limit it is not read");
    }
}
