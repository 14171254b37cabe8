//! Bodies as the engine sees them: a stream of `Bytes`. The upstream's answer comes in
//! as a [`BodyStream`]; the owner task feeds its caller through a [`CallerBody`] while it
//! records the answer.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;

use crate::budget::Reservation;
use crate::delivery::Delivery;
use crate::BoxError;

/// An answer's body: its chunks, or the error that broke it off.
pub type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, BoxError>> + Send>>;

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
pub struct CallerBody {
    rx: mpsc::UnboundedReceiver<Result<FedChunk, BoxError>>,
    /// The body's length, when its caller was told it: the caller has the whole answer
    /// with its last byte (and may stop reading before the end).
    length: Option<u64>,
    sent: u64,
    /// Told when the answer was read to its end (see [`crate::delivery`]).
    delivery: Option<Box<Delivery>>,
}

impl CallerBody {
    pub(crate) fn new(length: Option<u64>) -> (Feed, CallerBody) {
        let (tx, rx) = mpsc::unbounded_channel();
        let body = CallerBody {
            rx,
            length,
            sent: 0,
            delivery: None,
        };
        (tx, body)
    }

    /// Tells `delivery` when the body has been read to its end.
    pub(crate) fn deliver(&mut self, delivery: Delivery) {
        self.delivery = Some(Box::new(delivery));
    }

    fn delivered(&mut self) {
        if let Some(d) = self.delivery.take() {
            d.done();
        }
    }
}

impl std::fmt::Debug for CallerBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerBody").finish_non_exhaustive()
    }
}

impl Stream for CallerBody {
    type Item = Result<Bytes, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            // The chunk's charge is given back here: it is the caller's now.
            Poll::Ready(Some(Ok(chunk))) => {
                self.sent += chunk.bytes.len() as u64;
                if self.length == Some(self.sent) {
                    self.delivered();
                }
                Poll::Ready(Some(Ok(chunk.bytes)))
            }
            Poll::Ready(Some(Err(e))) => {
                // Broken off: not delivered (a delivery dropped undone says so).
                self.delivery = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.delivered();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn caller_body_ends_when_the_sender_is_dropped() {
        let (tx, body) = CallerBody::new(None);
        tokio::spawn(async move {
            for b in [&b"a"[..], b"b"] {
                let chunk = FedChunk {
                    bytes: Bytes::from_static(b),
                    _charge: None,
                };
                tx.send(Ok(chunk)).unwrap();
            }
        });
        let got: Vec<Bytes> = body.map(|c| c.unwrap()).collect().await;
        assert_eq!(got.concat(), b"ab");
    }
}
