//! Whether an answer reached its caller: the evidence a key made up for a retry needs
//! (`oncely_store::churn`). A [`Delivery`] goes with an answer to its caller's body; the
//! body says when it was written to its end ([`Delivery::done`]). An owner's delivery
//! dropped before that (the caller went away, its request was cancelled, the answer broke
//! off or never came) writes the record's undelivered entry, so that a retry under a new
//! key joins it; a repeat's delivery done of a record known undelivered deletes that entry,
//! since an answer did reach a caller after all.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use oncely_core::{Record, State};
use oncely_store::{churn, Churn, ChurnKind, Store};

/// What a call under a client key brings on a route that recognises made-up keys.
#[derive(Debug, Clone)]
pub struct CallChurn {
    /// The route's windows.
    pub churn: Churn,
    /// Set by the engine when this call's key joined another key's record now: its first
    /// request, counted once (`oncely_key_churn_total`).
    pub joined: Arc<AtomicBool>,
}

impl CallChurn {
    /// For a route of `churn`.
    pub fn new(churn: Churn) -> CallChurn {
        CallChurn {
            churn,
            joined: Arc::default(),
        }
    }

    /// Whether the call's key joined another key's record now.
    pub fn joined_now(&self) -> bool {
        self.joined.load(Ordering::Relaxed)
    }
}

/// One answer on its way to one caller. See the module docs.
pub struct Delivery {
    store: Arc<dyn Store>,
    /// `None` once done.
    record: Option<Record>,
    /// Set for the owner's caller: its delivery dropped undone marks the record.
    churn: Option<Churn>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("record", &self.record.as_ref().map(|r| &r.id))
            .field("owner", &self.churn.is_some())
            .finish()
    }
}

impl Delivery {
    /// The delivery of an owner's answer, on a route of `churn`.
    pub(crate) fn owner(store: Arc<dyn Store>, record: &Record, churn: Churn) -> Delivery {
        Delivery {
            store,
            record: Some(record.clone()),
            churn: Some(churn),
        }
    }

    /// The delivery of a repeat's answer of `record`, when this instance knows the record
    /// undelivered (else there is nothing to say of it).
    pub fn repeat(store: &Arc<dyn Store>, record: &Record) -> Option<Delivery> {
        let known = store
            .churn_filter()
            .is_some_and(|f| f.undelivered(&record.id));
        known.then(|| Delivery {
            store: store.clone(),
            record: Some(record.clone()),
            churn: None,
        })
    }

    /// The answer was written to its end.
    pub fn done(mut self) {
        let Some(record) = self.record.take() else {
            return;
        };
        let known = self
            .store
            .churn_filter()
            .is_some_and(|f| f.undelivered(&record.id));
        if known {
            let store = self.store.clone();
            spawn(async move {
                if let Err(e) = store.churn_forget(&record.id).await {
                    tracing::warn!(record = %record.id, error = %e,
                        "could not record that an answer reached its caller");
                }
            });
        }
    }

    /// The owner's call ended without an answer to deliver, and nothing need be said of it
    /// (its record was released: a retry executes again under any key).
    pub(crate) fn settled(mut self, record: &Record) {
        if record.state == State::Released {
            self.record = None;
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        let (Some(record), Some(c)) = (self.record.take(), self.churn) else {
            return;
        };
        let Some(filter) = self.store.churn_filter() else {
            return;
        };
        // Known here at once, before it is written: a retry that comes right after waits
        // for the write instead of missing it.
        let hash = churn::undelivered_hash(&record.scope, &record.fingerprint);
        let until = record.created_at.plus(c.window);
        filter.expect(hash, record.id.clone(), ChurnKind::Undelivered, until);
        let store = self.store.clone();
        spawn(async move {
            // No read of the ledger's clock first: the sooner it is written, the sooner
            // another instance knows. (`at` is only shown.)
            let now = oncely_store::Clock::now(&oncely_store::SystemClock);
            let entry = churn::undelivered(&record, c, now);
            let written = store.churn_put(&entry);
            let ok = match written.await {
                Ok(written) => {
                    tracing::debug!(record = %record.id, written, "the caller went away before its answer");
                    true
                }
                Err(e) => {
                    tracing::warn!(record = %record.id, error = %e,
                        "could not record that a caller went away before its answer");
                    false
                }
            };
            if let Some(filter) = store.churn_filter() {
                filter.written(&hash, ok);
            }
        });
    }
}

fn spawn(f: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(f);
    }
}
