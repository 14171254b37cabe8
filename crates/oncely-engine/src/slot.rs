//! Waiting for an upstream slot is not calling the upstream.
//!
//! A route's `concurrency` limit is enforced where the request is sent (the binary's
//! proxy), inside the upstream future the owner task runs. The owner runs that future
//! in the scope of a [`SendGate`], and the sender wraps its wait for a slot in
//! [`wait_for_slot`]: the owner then knows whether its call is still queued. While it is,
//! the route's `timeout` measures the wait, not an upstream call; a call that is still
//! queued when it runs out was never sent, so its record is released (never
//! `outcome_unknown`) and the caller is told the upstream is busy. Once a slot is taken,
//! the upstream gets its whole `timeout`.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

/// Where a guarded call stands on its way to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Nobody said: the call may have been sent at any time (the safe assumption).
    Unmarked,
    /// Waiting for a slot: nothing sent yet.
    Queued,
    /// The slot is taken; the request is being sent.
    Sending,
}

/// One owner's view of its call's phase.
#[derive(Debug)]
pub(crate) struct SendGate(watch::Sender<Phase>);

impl SendGate {
    pub(crate) fn new() -> Arc<SendGate> {
        Arc::new(SendGate(watch::channel(Phase::Unmarked).0))
    }

    pub(crate) fn phase(&self) -> Phase {
        *self.0.borrow()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Phase> {
        self.0.subscribe()
    }
}

tokio::task_local! {
    static GATE: Arc<SendGate>;
}

/// Runs `fut` (an owner's upstream call) with `gate` as its [`SendGate`].
pub(crate) fn scope<F: Future>(gate: Arc<SendGate>, fut: F) -> impl Future<Output = F::Output> {
    GATE.scope(gate, fut)
}

/// Awaits `acquire` (a wait for one of the route's upstream slots) as a wait, not as an
/// upstream call: the guarded call's owner does not count it against the upstream
/// `timeout` and, should the call still be queued when `timeout` runs out, releases its
/// record (nothing was sent) instead of taking it for an upstream timeout. Outside an
/// owner task (an unguarded request) it is just `acquire`.
pub async fn wait_for_slot<F: Future>(acquire: F) -> F::Output {
    let gate = GATE.try_with(Arc::clone).ok();
    if let Some(g) = &gate {
        g.0.send_replace(Phase::Queued);
    }
    let out = acquire.await;
    if let Some(g) = &gate {
        g.0.send_replace(Phase::Sending);
    }
    out
}

/// Whether the caller runs inside a guarded call's owner task, whose owner times the
/// upstream call itself (the route's `timeout`, the wait for a slot); outside one (an
/// unguarded request), the sender has to.
pub fn in_guarded_call() -> bool {
    GATE.try_with(|_| ()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_gate_sees_the_wait_and_the_send() {
        let gate = SendGate::new();
        let seen = gate.clone();
        let sem = Arc::new(tokio::sync::Semaphore::new(0));
        let s = sem.clone();
        let call = tokio::spawn(scope(gate.clone(), async move {
            let _permit = wait_for_slot(s.acquire_owned()).await.unwrap();
        }));
        let mut rx = seen.subscribe();
        rx.wait_for(|p| *p == Phase::Queued).await.unwrap();
        sem.add_permits(1);
        rx.wait_for(|p| *p == Phase::Sending).await.unwrap();
        call.await.unwrap();
        // Outside a gate's scope it only waits.
        let free = Arc::new(tokio::sync::Semaphore::new(1));
        assert!(wait_for_slot(free.acquire_owned()).await.is_ok());
    }
}
