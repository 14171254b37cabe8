//! What an endpoint tracks of its clients' sessions ([`Sessions`]): the guarded calls in
//! flight, whose cancellations are dropped (and, in a session, honoured towards the
//! client), and the upstream calls it owns on each session, whose end is held back until
//! they are done. Keyed by plain values (the session id, the JSON-RPC request id), so any
//! transport can use it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::Value;
use tokio::time::Instant;

use crate::jsonrpc;

/// The guarded calls in flight and the upstream calls owned, by client session.
pub(super) struct Sessions {
    /// Guarded calls this endpoint is answering or running now, by (session, request id):
    /// their cancellations are dropped.
    guarded: Mutex<HashMap<(Option<String>, String), Guarded>>,
    /// Upstream calls this endpoint owns now, by the client session they were sent on: the
    /// session's end (`DELETE`) is held back from the upstream until they are done.
    owned: Mutex<HashMap<String, usize>>,
    /// Woken whenever an owned call ends.
    owned_ended: tokio::sync::Notify,
}

/// A guarded call's entry in the cancellation filter: how many hold it (its callers, its
/// owner's upstream call), and whether its client has cancelled it.
struct Guarded {
    count: usize,
    cancelled: tokio::sync::watch::Sender<bool>,
}

/// Removes a guarded call from the cancellation filter when dropped (and, for the owner's
/// upstream call, from its session's count of owned calls).
pub(super) struct Tracked {
    sessions: Arc<Sessions>,
    key: (Option<String>, String),
    owner: bool,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut map = self
            .sessions
            .guarded
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&self.key) {
            entry.count -= 1;
            if entry.count == 0 {
                map.remove(&self.key);
            }
        }
        drop(map);
        if let (true, Some(session)) = (self.owner, &self.key.0) {
            let mut owned = self
                .sessions
                .owned
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(n) = owned.get_mut(session) {
                *n -= 1;
                if *n == 0 {
                    owned.remove(session);
                }
            }
            drop(owned);
            self.sessions.owned_ended.notify_waiters();
        }
    }
}

impl Sessions {
    /// No call in flight, none owned.
    pub(super) fn new() -> Sessions {
        Sessions {
            guarded: Mutex::new(HashMap::new()),
            owned: Mutex::new(HashMap::new()),
            owned_ended: tokio::sync::Notify::new(),
        }
    }

    /// Whether upstream calls this endpoint owns run on `session` now.
    pub(super) fn owns_calls_on(&self, session: &str) -> bool {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.contains_key(session)
    }

    /// Resolves once no upstream call this endpoint owns runs on `session`, or at
    /// `deadline` (when they cannot still be running).
    pub(super) async fn owned_calls_done(&self, session: &str, deadline: Instant) {
        loop {
            let ended = self.owned_ended.notified();
            if !self.owns_calls_on(session) {
                break;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                break;
            }
        }
    }

    /// Whether `id` names a guarded call in flight (its cancellation is then dropped). In
    /// a session, the cancellation is honoured towards the client: its request gets no
    /// more of the answer. Without a session, ids are not one client's, so nothing more.
    pub(super) fn is_guarded_in_flight(&self, session: &Option<String>, id: &str) -> bool {
        let map = self.guarded.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&(session.clone(), id.to_string())) {
            Some(entry) => {
                if session.is_some() {
                    entry.cancelled.send_replace(true);
                }
                true
            }
            None => false,
        }
    }

    /// Resolves when the client cancels its call `id` of `session` (never without a
    /// session); `None` then.
    pub(super) fn cancellation(
        &self,
        session: &Option<String>,
        id: &Value,
    ) -> Option<BoxFuture<'static, ()>> {
        session.as_ref()?;
        let map = self.guarded.lock().unwrap_or_else(|e| e.into_inner());
        let mut rx = map
            .get(&(session.clone(), jsonrpc::id_text(id)))?
            .cancelled
            .subscribe();
        Some(
            async move {
                if rx.wait_for(|c| *c).await.is_err() {
                    futures::future::pending::<()>().await;
                }
            }
            .boxed(),
        )
    }

    /// Enters the guarded call `id` of `session` in the cancellation filter, for one of its
    /// callers or (`owner`) for the owner's upstream call, which also counts as a call
    /// owned on the session; until the returned [`Tracked`] is dropped.
    pub(super) fn track(
        self: &Arc<Self>,
        session: &Option<String>,
        id: &Value,
        owner: bool,
    ) -> Tracked {
        let key = (session.clone(), jsonrpc::id_text(id));
        {
            let mut map = self.guarded.lock().unwrap_or_else(|e| e.into_inner());
            let entry = map.entry(key.clone()).or_insert_with(|| Guarded {
                count: 0,
                cancelled: tokio::sync::watch::channel(false).0,
            });
            entry.count += 1;
            if !owner {
                // A new request under this id: not cancelled (yet).
                entry.cancelled.send_replace(false);
            }
        }
        if let (true, Some(s)) = (owner, session) {
            *self
                .owned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(s.clone())
                .or_insert(0) += 1;
        }
        Tracked {
            sessions: self.clone(),
            key,
            owner,
        }
    }
}
