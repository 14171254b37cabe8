//! Bodies: boxing any body (even one that is not `Sync`, like axum's) into [`BoxBody`],
//! and the edge between HTTP bodies and the engine's streams: an upstream body goes to
//! the engine as a [`BodyStream`], and the channel through which an owner task streams
//! an upstream answer to its caller comes back as an HTTP body.

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyDataStream, BodyExt};
use oncely_engine::{BodyStream, CallerBody};

use crate::{BoxBody, BoxError};

/// Boxes any body with `Bytes` chunks into a [`BoxBody`]. Bodies that are not `Sync`
/// (axum's `Body`) are wrapped so that they are: a body is only ever polled through
/// `&mut`, so the wrapper never locks.
pub fn boxed<B>(body: B) -> BoxBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    SyncBody(Mutex::new(Box::pin(body)))
        .map_err(Into::into)
        .boxed()
}

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> BoxBody {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A `Send` body made `Sync`: `Mutex::get_mut` gives exclusive access without locking,
/// which is sound because polling already needs `&mut`.
struct SyncBody<B>(Mutex<Pin<Box<B>>>);

impl<B: Body> Body for SyncBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let inner = match self.get_mut().0.get_mut() {
            Ok(inner) => inner,
            // Never locked, so never poisoned; treat it as the end rather than panic.
            Err(_) => return Poll::Ready(None),
        };
        inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        // `is_end_stream` takes `&self`; asking through the mutex would lock, which is
        // cheap and uncontended, but a conservative `false` is always correct.
        false
    }

    fn size_hint(&self) -> SizeHint {
        match self.0.try_lock() {
            Ok(inner) => inner.size_hint(),
            Err(_) => SizeHint::default(),
        }
    }
}

/// An HTTP body as the engine reads it: its data chunks (trailers are skipped).
pub fn stream(body: BoxBody) -> BodyStream {
    Box::pin(BodyDataStream::new(body))
}

/// The caller's end of an owner task's answer as an HTTP body: chunks as the owner reads
/// them, an error if the upstream broke off, and the end once the owner has recorded the
/// answer. `length` is the answer's `Content-Length`, if it had one.
pub(crate) fn caller(body: CallerBody, length: Option<u64>) -> BoxBody {
    let hint = match length {
        Some(n) => SizeHint::with_exact(n),
        None => SizeHint::default(),
    };
    BoxBody::new(ChannelBody { rx: body, hint })
}

/// A stream of chunks as an HTTP body, of `length` bytes when it is known in advance.
pub fn streamed(body: BodyStream, length: Option<u64>) -> BoxBody {
    let hint = match length {
        Some(n) => SizeHint::with_exact(n),
        None => SizeHint::default(),
    };
    boxed(ChannelBody { rx: body, hint })
}

struct ChannelBody<S> {
    rx: S,
    hint: SizeHint,
}

impl<S> Body for ChannelBody<S>
where
    S: futures::Stream<Item = Result<Bytes, BoxError>> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.rx).poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn boxes_unsync_bodies() {
        let body = axum::body::Body::from("hello");
        let boxed = boxed(body);
        assert_eq!(boxed.collect().await.unwrap().to_bytes(), "hello");
    }
}
