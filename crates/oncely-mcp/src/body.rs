//! The response body type of the MCP service, and the channel body that carries an owned
//! upstream call's stream to a client that may leave at any time.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;

use crate::BoxError;

/// Every response body the endpoint answers with.
pub type McpBody = BoxBody<Bytes, BoxError>;

/// A whole body.
pub(crate) fn full(bytes: impl Into<Bytes>) -> McpBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A body fed by an owned upstream call. Dropping it (the client left) only makes the
/// sender's next send fail, which the owner ignores: the call goes on.
pub(crate) struct ChannelBody {
    pub(crate) rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

pin_project_lite::pin_project! {
    /// Passes a body through frame by frame and hands a copy (up to `limit` bytes) to
    /// `on_end` when it ends: how `tools/list` answers teach the catalog without being held.
    pub(crate) struct Tap<B, F: FnOnce(&[u8])> {
        #[pin]
        inner: B,
        seen: Vec<u8>,
        limit: usize,
        on_end: Option<F>,
    }
}

impl<B, F: FnOnce(&[u8])> Tap<B, F> {
    pub(crate) fn new(inner: B, limit: usize, on_end: F) -> Tap<B, F> {
        Tap {
            inner,
            seen: Vec::new(),
            limit,
            on_end: Some(on_end),
        }
    }
}

impl<B, F> Body for Tap<B, F>
where
    B: Body<Data = Bytes>,
    F: FnOnce(&[u8]),
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if this.seen.len() + data.len() <= *this.limit {
                        this.seen.extend_from_slice(data);
                    } else {
                        *this.on_end = None;
                    }
                }
            }
            Poll::Ready(None) => {
                if let Some(f) = this.on_end.take() {
                    f(this.seen);
                }
            }
            _ => {}
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
