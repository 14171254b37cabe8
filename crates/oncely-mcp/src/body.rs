//! The response body type of the MCP service, and the tap that reads `tools/list`
//! answers on their way through.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

use crate::{sse, BoxError};

/// Every response body the endpoint answers with.
pub type McpBody = BoxBody<Bytes, BoxError>;

/// A whole body.
pub(crate) fn full(bytes: impl Into<Bytes>) -> McpBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pin_project_lite::pin_project! {
    /// Passes a body through frame by frame and shows what it carries to `observe`: each
    /// SSE event's data as soon as the event is complete (before the client can act on
    /// it), or a JSON body whole (up to `limit` bytes) at its end. This is how `tools/list`
    /// answers teach the catalog without being held back.
    pub(crate) struct Tap<B, F: FnMut(&[u8])> {
        #[pin]
        inner: B,
        sse: Option<sse::Parser>,
        seen: Vec<u8>,
        limit: usize,
        done: bool,
        observe: F,
    }
}

impl<B, F: FnMut(&[u8])> Tap<B, F> {
    pub(crate) fn new(inner: B, is_sse: bool, limit: usize, observe: F) -> Tap<B, F> {
        Tap {
            inner,
            sse: is_sse.then(|| sse::Parser::new(limit)),
            seen: Vec::new(),
            limit,
            done: false,
            observe,
        }
    }
}

impl<B, F> Body for Tap<B, F>
where
    B: Body<Data = Bytes>,
    F: FnMut(&[u8]),
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let mut ended = matches!(polled, Poll::Ready(None));
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                match this.sse {
                    Some(parser) => {
                        for event in parser.feed(data) {
                            (this.observe)(event.data.as_bytes());
                        }
                    }
                    None if this.seen.len() + data.len() <= *this.limit => {
                        this.seen.extend_from_slice(data)
                    }
                    None => *this.done = true,
                }
            }
            // A body with a known length is not polled past its last frame.
            ended = this.inner.is_end_stream();
        }
        if ended && !*this.done {
            *this.done = true;
            if this.sse.is_none() {
                (this.observe)(this.seen);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
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

pin_project_lite::pin_project! {
    /// An upstream answer whose break-off reads as its end: the classifier then finds no
    /// response in it and marks the call `outcome_unknown` (it was sent and may have run),
    /// instead of the engine releasing it as a lost exchange.
    pub(crate) struct BreakAsEnd<B> {
        #[pin]
        inner: B,
        ended: bool,
    }
}

impl<B> BreakAsEnd<B> {
    pub(crate) fn new(inner: B) -> BreakAsEnd<B> {
        BreakAsEnd {
            inner,
            ended: false,
        }
    }
}

impl<B> Body for BreakAsEnd<B>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
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
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                tracing::warn!(error = %e, "the MCP server's answer broke off");
                *this.ended = true;
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }
}
