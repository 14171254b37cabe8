//! Waits on a record shared by the claimants of this instance: one
//! [`Waiting::wait_for`](oncely_store::Waiting::wait_for) per record however many wait on
//! it, woken by one read of it, sharing the answer it holds (one copy, however many
//! joiners). The claim loop (`claim`) waits through it; it uses nothing of the engine's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use oncely_core::{Record, RecordId};
use oncely_store::{Store, StoreError};

/// The waits on records running now, by record.
#[derive(Default)]
pub(crate) struct Waits(Mutex<HashMap<RecordId, SharedWait>>);

/// One `wait_for` shared by the claimants of this instance waiting on one record.
type SharedWait = Shared<BoxFuture<'static, Result<Record, WaitError>>>;

/// A shared wait's error (a [`StoreError`] is not `Clone`).
#[derive(Debug, Clone)]
enum WaitError {
    NotFound(RecordId),
    Store(String),
}

impl Waits {
    /// [`Waiting::wait_for`](oncely_store::Waiting::wait_for) on `store`, shared by every
    /// claimant of this instance waiting on the same record. A claimant whose own
    /// `timeout` ends first reads the record as it is then.
    pub(crate) async fn wait(
        &self,
        store: &Arc<dyn Store>,
        id: &RecordId,
        timeout: Duration,
    ) -> Result<Record, StoreError> {
        let shared = {
            let mut waits = self.0.lock().expect("waits lock");
            match waits.get(id) {
                Some(w) => w.clone(),
                None => {
                    let store = store.clone();
                    let key = id.clone();
                    let w = async move {
                        store.wait_for(&key, timeout).await.map_err(|e| match e {
                            StoreError::NotFound(id) => WaitError::NotFound(id),
                            other => WaitError::Store(other.to_string()),
                        })
                    }
                    .boxed()
                    .shared();
                    waits.insert(id.clone(), w.clone());
                    w
                }
            }
        };
        // Forgotten by whoever leaves it (woken, timed out or cancelled), so that the
        // next wait reads afresh; the others keep their clones.
        let _forget = ForgetWait {
            waits: &self.0,
            id,
            shared: shared.clone(),
        };
        match tokio::time::timeout(timeout, shared).await {
            Ok(Ok(record)) => Ok(record),
            Ok(Err(WaitError::NotFound(id))) => Err(StoreError::NotFound(id)),
            Ok(Err(WaitError::Store(e))) => Err(StoreError::Unavailable(e)),
            Err(_) => store
                .get(id)
                .await?
                .ok_or_else(|| StoreError::NotFound(id.clone())),
        }
    }
}

/// Removes a shared wait from the map when one of its waiters leaves, unless the map
/// already holds a newer one.
struct ForgetWait<'a> {
    waits: &'a Mutex<HashMap<RecordId, SharedWait>>,
    id: &'a RecordId,
    shared: SharedWait,
}

impl Drop for ForgetWait<'_> {
    fn drop(&mut self) {
        let mut waits = self.waits.lock().expect("waits lock");
        if waits.get(self.id).is_some_and(|w| w.ptr_eq(&self.shared)) {
            waits.remove(self.id);
        }
    }
}
