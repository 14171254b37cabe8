//! What the ingress, the delivery worker and the dead-letter operations share about the
//! store's queue: the task kind deliveries are queued under ([`TASK_KIND`]) and the
//! [`Waker`] that tells this process's worker a delivery is due now.

use std::sync::Arc;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// The task kind of webhook deliveries in the store's queue.
pub const TASK_KIND: &str = "webhook";

/// Wakes a delivery worker now (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Waker(Arc<Notify>);

impl Waker {
    /// Makes the worker look for due tasks now.
    pub fn wake(&self) {
        self.0.notify_one();
    }

    /// Completes at the next [`Waker::wake`] (or at once if one came since the last).
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.0.notified()
    }
}
