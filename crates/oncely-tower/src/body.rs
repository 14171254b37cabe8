//! Bodies: boxing any body (even one that is not `Sync`, like axum's) into [`BoxBody`],
//! and the channel body through which an owner task streams an upstream answer to its
//! caller while it records it.

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use crate::budget::Reservation;
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

/// One chunk on its way to an owner's caller, with the share of the in-flight budget
/// it holds until the caller has read it.
pub(crate) struct FedChunk {
    pub(crate) bytes: Bytes,
    pub(crate) _charge: Option<Reservation>,
}

/// The owner's end of its caller's body. It never waits: the owner reads the upstream
/// at the upstream's pace whatever its caller does, and what the caller has not read yet
/// waits here (bounded by the in-flight budget, see [`crate::budget`]).
pub(crate) type Feed = mpsc::UnboundedSender<Result<FedChunk, BoxError>>;

/// The receiving end of an owner task's answer: chunks as the owner reads them, an
/// error if the upstream broke off, and the end once the owner has recorded the answer.
pub(crate) struct ChannelBody {
    rx: mpsc::UnboundedReceiver<Result<FedChunk, BoxError>>,
    hint: SizeHint,
}

impl ChannelBody {
    pub(crate) fn new(length: Option<u64>) -> (Feed, ChannelBody) {
        let (tx, rx) = mpsc::unbounded_channel();
        let hint = match length {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        };
        (tx, ChannelBody { rx, hint })
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.rx.poll_recv(cx) {
            // The chunk's charge is given back here: it is the caller's now.
            Poll::Ready(Some(Ok(chunk))) => Poll::Ready(Some(Ok(Frame::data(chunk.bytes)))),
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

    #[tokio::test]
    async fn channel_body_ends_when_the_sender_is_dropped() {
        let (tx, body) = ChannelBody::new(None);
        tokio::spawn(async move {
            for b in [&b"a"[..], b"b"] {
                let chunk = FedChunk {
                    bytes: Bytes::from_static(b),
                    _charge: None,
                };
                tx.send(Ok(chunk)).unwrap();
            }
        });
        assert_eq!(body.collect().await.unwrap().to_bytes(), "ab");
    }
}
