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
