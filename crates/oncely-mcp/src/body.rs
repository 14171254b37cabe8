//! The bodies that edit, cut or end the upstream's answers on their way through (every
//! response body is the workspace's one [`BoxBody`](oncely_http::BoxBody)).

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::sse;
use bytes::Bytes;
use http_body::{Body, Frame};

pub(crate) use oncely_http::full;

/// What an [`Edit`] does to each JSON-RPC message of an answer: changes it in place and
/// says whether it did.
pub(crate) use crate::core::edit::EditFn;

pin_project_lite::pin_project! {
    /// Passes a body through and hands each JSON-RPC message it carries to `edit`, which
    /// may change it: each SSE event as soon as it is complete (so a stream is never held
    /// back for more than one event), or a JSON body whole at its end (one message or a
    /// batch). A JSON body `edit` leaves alone goes out as it came, and one over `limit`
    /// bytes is passed through unread; an SSE event goes out again as its `id`, `event`
    /// and `data` lines (comments and `retry` lines are not kept). This is how `tools/list` answers teach the catalog
    /// and `server/discover` answers learn oncely's own capabilities on their way through.
    pub(crate) struct Edit<B> {
        #[pin]
        inner: B,
        sse: Option<sse::Parser>,
        held: Vec<u8>,
        limit: usize,
        passing: bool,
        done: bool,
        edit: EditFn,
    }
}

impl<B> Edit<B> {
    pub(crate) fn new(inner: B, is_sse: bool, limit: usize, edit: EditFn) -> Edit<B> {
        Edit {
            inner,
            sse: is_sse.then(|| sse::Parser::new(limit)),
            held: Vec::new(),
            limit,
            passing: false,
            done: false,
            edit,
        }
    }
}

/// An event as SSE text again (`id`, `event`, one `data:` line per line of its data).
fn event_text(event: &sse::Event, out: &mut Vec<u8>) {
    if let Some(id) = &event.id {
        out.extend_from_slice(format!("id: {id}\n").as_bytes());
    }
    if !event.event.is_empty() {
        out.extend_from_slice(format!("event: {}\n", event.event).as_bytes());
    }
    for line in event.data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// Applies `edit` to the message(s) of a whole JSON body; `None` when it changed nothing.
fn edit_json(body: &[u8], edit: &mut EditFn) -> Option<Vec<u8>> {
    let mut value = crate::jsonrpc::parse(body)?;
    let changed = match &mut value {
        serde_json::Value::Array(items) => items.iter_mut().fold(false, |c, m| edit(m) | c),
        message => edit(message),
    };
    changed.then(|| serde_json::to_vec(&value).unwrap_or_default())
}

impl<B> Body for Edit<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        loop {
            if *this.done {
                return Poll::Ready(None);
            }
            let frame = match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => Some(frame),
                Poll::Ready(None) => None,
            };
            let ended = frame.is_none() || this.inner.is_end_stream();
            let data = match frame.map(Frame::into_data) {
                Some(Ok(data)) => data,
                // Trailers pass as they are.
                Some(Err(frame)) => return Poll::Ready(Some(Ok(frame))),
                None => Bytes::new(),
            };
            if *this.passing {
                *this.done = ended;
                if data.is_empty() && ended {
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            let out = match this.sse {
                Some(parser) => {
                    let mut events = parser.feed(&data);
                    if ended {
                        events.extend(parser.feed(b"\n\n"));
                    }
                    let mut out = Vec::new();
                    for mut event in events {
                        if let Ok(mut message) = serde_json::from_str(&event.data) {
                            if (this.edit)(&mut message) {
                                event.data = message.to_string();
                            }
                        }
                        event_text(&event, &mut out);
                    }
                    out
                }
                None if this.held.len() + data.len() > *this.limit => {
                    // Too large to read: the rest passes through as it comes.
                    *this.passing = true;
                    let mut out = std::mem::take(this.held);
                    out.extend_from_slice(&data);
                    out
                }
                None => {
                    this.held.extend_from_slice(&data);
                    if !ended {
                        continue;
                    }
                    let held = std::mem::take(this.held);
                    edit_json(&held, this.edit).unwrap_or(held)
                }
            };
            *this.done = ended;
            if out.is_empty() {
                if ended {
                    return Poll::Ready(None);
                }
                continue;
            }
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

pin_project_lite::pin_project! {
    /// Passes a body through until `cancel` resolves, then ends it: a client that cancelled
    /// its request gets no more of the answer (the owner task reads and records it all the
    /// same).
    pub(crate) struct UntilCancelled<B> {
        #[pin]
        inner: B,
        // A Mutex only to make the body Sync; it is never contended (`get_mut`).
        cancel: Option<std::sync::Mutex<futures::future::BoxFuture<'static, ()>>>,
        ended: bool,
    }
}

impl<B> UntilCancelled<B> {
    pub(crate) fn new(
        inner: B,
        cancel: futures::future::BoxFuture<'static, ()>,
    ) -> UntilCancelled<B> {
        UntilCancelled {
            inner,
            cancel: Some(std::sync::Mutex::new(cancel)),
            ended: false,
        }
    }
}

impl<B: Body<Data = Bytes>> Body for UntilCancelled<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        if let Some(cancel) = this.cancel.as_mut() {
            let cancel = cancel.get_mut().unwrap_or_else(|e| e.into_inner());
            if cancel.as_mut().poll(cx).is_ready() {
                *this.cancel = None;
                *this.ended = true;
                return Poll::Ready(None);
            }
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.ended {
            http_body::SizeHint::with_exact(0)
        } else {
            // Cancelling may end it early: no exact length.
            let mut hint = http_body::SizeHint::new();
            hint.set_upper(self.inner.size_hint().upper().unwrap_or(u64::MAX));
            hint
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// Reads `chunks` through an [`Edit`] that marks the response to id 1.
    async fn edited(chunks: &[&str], is_sse: bool, limit: usize) -> String {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from(c.to_string()))))
            .collect();
        let body = http_body_util::StreamBody::new(futures::stream::iter(frames));
        let edit: EditFn = Box::new(|m: &mut serde_json::Value| {
            if m.get("id") != Some(&serde_json::json!(1)) {
                return false;
            }
            m["result"]["edited"] = true.into();
            true
        });
        let out = Edit::new(body, is_sse, limit, edit)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn edits_the_named_response_in_a_stream_a_batch_and_a_body() {
        // An event split across chunks, a notification left alone, then the response.
        let sse = edited(
            &[
                "event: message\nid: 7\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n\ndata: {\"id\":",
                "1,\"result\":{}}\n\n",
            ],
            true,
            1 << 20,
        )
        .await;
        assert_eq!(
            sse,
            "id: 7\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n\n\
             data: {\"id\":1,\"result\":{\"edited\":true}}\n\n"
        );
        let batch = edited(
            &[r#"[{"id":2,"result":{}},"#, r#"{"id":1,"result":{}}]"#],
            false,
            1 << 20,
        )
        .await;
        let v: serde_json::Value = serde_json::from_str(&batch).unwrap();
        assert_eq!(v[1]["result"]["edited"], true);
        assert!(v[0]["result"].get("edited").is_none());
        // Untouched JSON goes out byte for byte; one over the limit passes unread.
        let other = r#"{ "id" : 2, "result": {"n": 1.50} }"#;
        assert_eq!(edited(&[other], false, 1 << 20).await, other);
        let big = r#"{"id":1,"result":{}}"#;
        assert_eq!(edited(&[&big[..8], &big[8..]], false, 10).await, big);
    }
}
