//! In-process wake-ups for [`Waiting::wait_for`](crate::Waiting::wait_for).
//!
//! A waiter subscribes to a record id *before* it reads the record, so a completion that
//! lands between the read and the wait still wakes it. Entries exist only while someone
//! waits, so the map stays as small as the number of waiting duplicates.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use oncely_core::RecordId;
use tokio::sync::Notify;

/// Who waits for which record, in this process.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    map: Mutex<HashMap<RecordId, Arc<Notify>>>,
}

/// A subscription; dropping it unsubscribes.
pub(crate) struct Subscription<'a> {
    waiters: &'a Waiters,
    id: RecordId,
    notify: Arc<Notify>,
}

impl Waiters {
    /// Subscribes to changes of `id`.
    pub(crate) fn subscribe(&self, id: &RecordId) -> Subscription<'_> {
        let notify = self
            .map
            .lock()
            .expect("waiters lock")
            .entry(id.clone())
            .or_default()
            .clone();
        Subscription {
            waiters: self,
            id: id.clone(),
            notify,
        }
    }

    /// Wakes everyone waiting on `id`.
    pub(crate) fn wake(&self, id: &RecordId) {
        let notify = self.map.lock().expect("waiters lock").get(id).cloned();
        if let Some(n) = notify {
            n.notify_waiters();
        }
    }

    /// Wakes every waiter (e.g. after another instance wrote to a shared file).
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = self
            .map
            .lock()
            .expect("waiters lock")
            .values()
            .cloned()
            .collect();
        for n in all {
            n.notify_waiters();
        }
    }

    /// Whether nobody waits in this process.
    #[cfg(feature = "sqlite")]
    pub(crate) fn is_empty(&self) -> bool {
        self.map.lock().expect("waiters lock").is_empty()
    }
}

impl Subscription<'_> {
    /// The notifier to await; call `enable()` on the future before checking the record.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.map.lock().expect("waiters lock");
        // The map and this subscription hold one reference each when it is the last.
        if Arc::strong_count(&self.notify) <= 2 {
            map.remove(&self.id);
        }
    }
}

/// Waits until `read` shows the record out of `processing`, or `timeout` passes; wakes
/// on [`Waiters::wake`] for `id`, and re-reads after every wake-up.
pub(crate) async fn wait_until_settled<F, Fut>(
    waiters: &Waiters,
    id: &RecordId,
    timeout: std::time::Duration,
    mut read: F,
) -> crate::Result<oncely_core::Record>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::Result<Option<oncely_core::Record>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let sub = waiters.subscribe(id);
    loop {
        let notified = sub.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let record = read()
            .await?
            .ok_or_else(|| crate::StoreError::NotFound(id.clone()))?;
        if record.state != oncely_core::State::Processing {
            return Ok(record);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Ok(record);
        }
    }
}
