//! The count of background tasks (owned upstream calls, job runs), so that a drain can
//! wait for them.

use tokio::sync::watch;

/// Counts background tasks (owned upstream calls); `wait_idle` returns when none runs.
#[derive(Debug)]
pub(crate) struct TaskCount(watch::Sender<usize>);

impl Default for TaskCount {
    fn default() -> TaskCount {
        TaskCount(watch::channel(0).0)
    }
}

/// One counted task; dropping it uncounts it.
pub struct TaskToken(watch::Sender<usize>);

impl TaskCount {
    pub(crate) fn start(&self) -> TaskToken {
        self.0.send_modify(|n| *n += 1);
        TaskToken(self.0.clone())
    }

    pub(crate) fn current(&self) -> usize {
        *self.0.borrow()
    }

    pub(crate) async fn wait_idle(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

impl Drop for TaskToken {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}
