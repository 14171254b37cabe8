//! Bodies: boxing any body (even one that is not `Sync`, like axum's) into [`BoxBody`],
//! and the edge between HTTP bodies and streams of chunks: an upstream body goes to the
//! engine as a [`BodyStream`], and any stream of chunks of a known size comes back as an
//! HTTP body ([`chunks`]: the channel through which an owner task streams an upstream
//! answer to its caller, a request body partly read then the rest of it). A body that
//! keeps something alive while it is read is [`holding`].

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::{Stream, StreamExt};
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

pub use oncely_http::full;

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
    chunks(body, hint)
}

/// A stream of chunks as an HTTP body, of `length` bytes when it is known in advance
/// (the stream need not be `Sync`: it is wrapped as [`boxed`] wraps a body).
pub fn streamed(body: BodyStream, length: Option<u64>) -> BoxBody {
    let hint = match length {
        Some(n) => SizeHint::with_exact(n),
        None => SizeHint::default(),
    };
    boxed(Chunks { chunks: body, hint })
}

/// A stream of chunks as an HTTP body of the size `hint` says (an error ends it): the one
/// hand-written body of chunks.
pub fn chunks<S>(chunks: S, hint: SizeHint) -> BoxBody
where
    S: Stream<Item = Result<Bytes, BoxError>> + Send + Sync + Unpin + 'static,
{
    BoxBody::new(Chunks { chunks, hint })
}

/// What was already read of `body`, then the rest of it, as one body (its trailers are
/// not carried on).
pub fn prefixed(read: impl IntoIterator<Item = Bytes>, body: BoxBody) -> BoxBody {
    let read: Vec<Bytes> = read.into_iter().collect();
    let len: u64 = read.iter().map(|c| c.len() as u64).sum();
    let rest = body.size_hint();
    let mut hint = SizeHint::new();
    hint.set_lower(rest.lower() + len);
    if let Some(upper) = rest.upper() {
        hint.set_upper(upper + len);
    }
    let read = futures::stream::iter(read.into_iter().map(Ok));
    chunks(read.chain(BodyDataStream::new(body)), hint)
}

/// `body`, keeping `held` (a concurrency permit) alive until it is finished or dropped:
/// the closure owns it, and the body owns the closure (`map_err` passes every frame, end
/// and size hint on as they are).
pub fn holding<T: Send + Sync + 'static>(body: BoxBody, held: T) -> BoxBody {
    body.map_err(move |e| {
        let _held = &held;
        e
    })
    .boxed()
}

struct Chunks<S> {
    chunks: S,
    hint: SizeHint,
}

impl<S> Body for Chunks<S>
where
    S: Stream<Item = Result<Bytes, BoxError>> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.chunks)
            .poll_next(cx)
            .map(|chunk| chunk.map(|c| c.map(Frame::data)))
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

/// `body`, telling `delivery` once it has been read to its end (its last frame taken, or
/// its end seen): a repeat's answer that reached its caller (`oncely_engine::delivery`).
pub(crate) fn delivered(body: BoxBody, delivery: oncely_engine::Delivery) -> BoxBody {
    Delivered {
        body,
        delivery: Some(delivery),
    }
    .boxed()
}

struct Delivered {
    body: BoxBody,
    delivery: Option<oncely_engine::Delivery>,
}

impl Body for Delivered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.done(),
            Poll::Ready(Some(Ok(_))) if self.body.is_end_stream() => self.done(),
            Poll::Ready(Some(Err(_))) => self.delivery = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Delivered {
    fn done(&mut self) {
        if let Some(d) = self.delivery.take() {
            d.done();
        }
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

    #[tokio::test]
    async fn what_was_read_comes_before_the_rest_and_the_size_adds_up() {
        let body = prefixed([Bytes::from("ab"), Bytes::from("cd")], full("ef"));
        assert_eq!(body.size_hint().exact(), Some(6));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdef");
    }

    #[tokio::test]
    async fn a_held_value_lives_as_long_as_its_body() {
        let held = std::sync::Arc::new(());
        let body = holding(full("x"), held.clone());
        assert_eq!(std::sync::Arc::strong_count(&held), 2);
        assert_eq!(body.size_hint().exact(), Some(1));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "x");
        assert_eq!(std::sync::Arc::strong_count(&held), 1);
    }
}
