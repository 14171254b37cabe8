//! The job board: what the layer and the job worker share on one instance (the first
//! requests waiting for their job's answer, the worker's wake-up, the job routes). A leaf:
//! the guard (`Guard`) holds it, the `jobs` module uses it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use http::HeaderMap;
use oncely_core::RecordId;
use tokio::sync::{oneshot, Notify};

use crate::policy::RoutePolicy;

/// What an owner task tells the first request of its job: the engine's head, with the
/// upstream's headers.
pub(crate) type Head = oncely_engine::Head<HeaderMap>;

/// What the layer and the worker share: the first requests waiting for their job's
/// answer on this instance, the worker's wake-up, and the job routes by name (to check
/// a status request's principal).
#[derive(Default)]
pub struct JobBoard {
    waiters: Mutex<HashMap<RecordId, oneshot::Sender<Head>>>,
    wake: Notify,
    routes: RwLock<HashMap<String, Arc<RoutePolicy>>>,
}

impl std::fmt::Debug for JobBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waiting = self.waiters.lock().map(|w| w.len()).unwrap_or(0);
        f.debug_struct("JobBoard")
            .field("waiting", &waiting)
            .finish_non_exhaustive()
    }
}

impl JobBoard {
    /// Makes a route's jobs known (for status requests before any job was submitted).
    pub fn register_route(&self, policy: Arc<RoutePolicy>) {
        let mut routes = self.routes.write().expect("job routes lock");
        routes.insert(policy.name.clone(), policy);
    }

    pub(crate) fn route(&self, name: &str) -> Option<Arc<RoutePolicy>> {
        self.routes
            .read()
            .expect("job routes lock")
            .get(name)
            .cloned()
    }

    pub(crate) fn wait_head(&self, id: &RecordId) -> oneshot::Receiver<Head> {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .expect("job waiters lock")
            .insert(id.clone(), tx);
        rx
    }

    pub(crate) fn forget(&self, id: &RecordId) {
        self.waiters.lock().expect("job waiters lock").remove(id);
    }

    pub(crate) fn take_head(&self, id: &RecordId) -> Option<oneshot::Sender<Head>> {
        self.waiters.lock().expect("job waiters lock").remove(id)
    }

    /// Whether this instance's worker took the head of `id` to send it.
    pub(crate) fn head_taken(&self, id: &RecordId) -> bool {
        !self
            .waiters
            .lock()
            .expect("job waiters lock")
            .contains_key(id)
    }

    /// Makes the worker look for due jobs now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Wakes when [`JobBoard::wake`] is called.
    pub(crate) async fn woken(&self) {
        self.wake.notified().await
    }
}
