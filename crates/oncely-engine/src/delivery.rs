//! Whether an answer reached its caller: the evidence a key made up for a retry needs
//! (`oncely_store::churn`). A [`Delivery`] goes with an answer to its caller's body; the
//! body says when it was written to its end ([`Delivery::done`]). An owner's delivery
//! dropped before that (the caller went away, its request was cancelled, the answer broke
//! off or never came) writes the record's undelivered entry, so that a retry under a new
//! key joins it; a repeat's delivery done of a record known undelivered deletes that entry,
//! since an answer did reach a caller after all.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use oncely_core::{Fingerprint, Identity, Record, RecordId, Scope, State};
use oncely_store::{churn, Churn, ChurnKind, Clock, Store, SystemClock};

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

/// What became of an owner's caller, shared by the call (its [`Delivery`]) and the claim
/// task that may make it the owner: a caller that goes away while its claim is still on
/// its way (a store that stalls) leaves an owner that runs for nobody, and the claim task
/// says so when it owns.
pub(crate) struct Watch {
    store: Arc<dyn Store>,
    churn: Churn,
    /// The call's scope and fingerprint, hashed ([`Watch::hash`]) only when a caller left
    /// or the filter knows of entries: three SHA-256 blocks a fresh call need not pay.
    scope: Scope,
    fingerprint: Fingerprint,
    hash: OnceLock<[u8; 16]>,
    seen: Mutex<Seen>,
}

enum Seen {
    /// The claim has not owned (yet).
    Claiming,
    /// This call owns the record and its caller waits for the answer.
    Owned(Box<Record>),
    /// The caller went away.
    Gone,
    /// The answer reached the caller, or there is nothing to say (released).
    Done,
}

impl Watch {
    /// The watch of a call of `call`'s identity on a route of `churn`.
    pub(crate) fn new(store: Arc<dyn Store>, call: &Identity, churn: Churn) -> Arc<Watch> {
        Arc::new(Watch {
            store,
            churn,
            scope: call.scope.clone(),
            fingerprint: call.fingerprint,
            hash: OnceLock::new(),
            seen: Mutex::new(Seen::Claiming),
        })
    }

    /// The call's undelivered hash (scope and fingerprint).
    fn hash(&self) -> [u8; 16] {
        *self
            .hash
            .get_or_init(|| churn::undelivered_hash(&self.scope, &self.fingerprint))
    }

    /// A claim of this call ended without owning: a caller that went away while it was on
    /// its way leaves nothing undelivered after all.
    pub(crate) fn unowned(&self) {
        let mut seen = self.seen.lock().expect("watch lock");
        if matches!(*seen, Seen::Gone) {
            *seen = Seen::Done;
            drop(seen);
            if let Some(filter) = self.store.churn_filter() {
                filter.written(&self.hash(), &churn::placeholder(), false);
            }
        }
    }

    /// The claim owns `record` (a claim, or a take-over).
    pub(crate) fn owned(&self, record: &Record) {
        let mut seen = self.seen.lock().expect("watch lock");
        match *seen {
            Seen::Claiming => *seen = Seen::Owned(Box::new(record.clone())),
            Seen::Gone => {
                *seen = Seen::Done;
                drop(seen);
                undelivered(&self.store, record.clone(), self.churn);
            }
            _ => {}
        }
    }

    fn gone(&self) {
        let mut seen = self.seen.lock().expect("watch lock");
        match std::mem::replace(&mut *seen, Seen::Gone) {
            Seen::Owned(record) => {
                *seen = Seen::Done;
                drop(seen);
                undelivered(&self.store, *record, self.churn);
            }
            Seen::Done => *seen = Seen::Done,
            // Its claim is still on its way (a store that stalls): a retry of its
            // fingerprint waits until that claim landed and said whether it owns.
            Seen::Claiming => {
                if let Some(filter) = self.store.churn_filter() {
                    let until = SystemClock.now().plus(self.churn.window);
                    filter.expect(
                        self.hash(),
                        churn::placeholder(),
                        ChurnKind::Undelivered,
                        until,
                    );
                }
            }
            Seen::Gone => {}
        }
    }

    /// The answer reached the caller (or there is nothing to say): the record it owned.
    fn done(&self) -> Option<RecordId> {
        match std::mem::replace(&mut *self.seen.lock().expect("watch lock"), Seen::Done) {
            Seen::Owned(record) => Some(record.id),
            _ => None,
        }
    }

    /// Whether the caller went away.
    pub(crate) fn is_gone(&self) -> bool {
        matches!(*self.seen.lock().expect("watch lock"), Seen::Gone)
    }
}

/// One answer on its way to one caller. See the module docs.
pub struct Delivery {
    kind: Kind,
}

enum Kind {
    /// The owner's caller: dropped undone, the record is undelivered.
    Owner(Arc<Watch>),
    /// A repeat's caller of a record known undelivered: done, it is delivered.
    Repeat(Arc<dyn Store>, RecordId),
    /// Done.
    Spent,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Owner(_) => "owner",
            Kind::Repeat(..) => "repeat",
            Kind::Spent => "spent",
        };
        f.debug_struct("Delivery").field("kind", &kind).finish()
    }
}

impl Delivery {
    /// The delivery of the answer of a call watched by `watch`, armed from before its
    /// claim.
    pub(crate) fn owner(watch: Arc<Watch>) -> Delivery {
        Delivery {
            kind: Kind::Owner(watch),
        }
    }

    /// The delivery of a repeat's answer of `record`, when this instance knows the record
    /// undelivered (else there is nothing to say of it).
    pub fn repeat(store: &Arc<dyn Store>, record: &Record) -> Option<Delivery> {
        let known = store
            .churn_filter()
            .is_some_and(|f| f.undelivered(&record.id));
        known.then(|| Delivery {
            kind: Kind::Repeat(store.clone(), record.id.clone()),
        })
    }

    /// The answer was written to its end.
    pub fn done(mut self) {
        let (store, id) = match std::mem::replace(&mut self.kind, Kind::Spent) {
            // An owner's answer of a record known undelivered (one whose failed attempt
            // nobody heard of, that this call ran again): one probe.
            Kind::Owner(watch) => match watch.done() {
                Some(id)
                    if watch
                        .store
                        .churn_filter()
                        .is_some_and(|f| !f.is_empty() && f.undelivered_as(&watch.hash(), &id)) =>
                {
                    (watch.store.clone(), id)
                }
                _ => return,
            },
            Kind::Repeat(store, id) => (store, id),
            Kind::Spent => return,
        };
        // Known undelivered (a repeat's answer of it, or a record another caller left
        // that this one joined under the same key): an answer did reach a caller.
        if store.churn_filter().is_some_and(|f| f.undelivered(&id)) {
            spawn(async move {
                if let Err(e) = store.churn_forget(&id).await {
                    tracing::warn!(record = %id, error = %e,
                        "could not record that an answer reached its caller");
                }
            });
        }
    }

    /// The call did not own its record (a repeat, a refusal): nothing to watch.
    pub(crate) fn unowned(mut self) {
        if let Kind::Owner(watch) = std::mem::replace(&mut self.kind, Kind::Spent) {
            watch.done();
        }
    }

    /// The owner's call ended without an answer to deliver, and nothing need be said of it
    /// when its record was released (a retry executes again under any key).
    pub(crate) fn settled(mut self, record: &Record) {
        if record.state == State::Released {
            if let Kind::Owner(watch) = std::mem::replace(&mut self.kind, Kind::Spent) {
                watch.done();
            }
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let Kind::Owner(watch) = std::mem::replace(&mut self.kind, Kind::Spent) {
            watch.gone();
        }
    }
}

/// How long the undelivered entry of a record is tried to be written while the ledger is
/// away, and the pauses between tries.
const UNDELIVERED_TRIES_FOR: Duration = Duration::from_secs(60);
const UNDELIVERED_PAUSE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(5));

/// Writes `record`'s undelivered entry, on a task of its own, trying again while the ledger
/// is away. Known here at once, before it is written: a retry that comes right after waits
/// for the write instead of missing it.
fn undelivered(store: &Arc<dyn Store>, record: Record, c: Churn) {
    let Some(filter) = store.churn_filter() else {
        return;
    };
    let hash = churn::undelivered_hash(&record.scope, &record.fingerprint);
    let until = record.created_at.plus(c.window);
    filter.expect(hash, record.id.clone(), ChurnKind::Undelivered, until);
    let store = store.clone();
    spawn(async move {
        // No read of the ledger's clock first: the sooner it is written, the sooner
        // another instance knows. (`at` is only shown.)
        let entry = churn::undelivered(&record, c, SystemClock.now());
        let deadline = tokio::time::Instant::now() + UNDELIVERED_TRIES_FOR;
        let mut tries = 0;
        let ok = loop {
            match store.churn_put(&entry).await {
                Ok(written) => {
                    tracing::debug!(record = %record.id, written, "the caller went away before its answer");
                    break true;
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    tracing::warn!(record = %record.id, error = %e,
                        "could not record that a caller went away before its answer");
                    break false;
                }
                Err(_) => {
                    let (first, max) = UNDELIVERED_PAUSE;
                    tokio::time::sleep(oncely_core::backoff::exponential(first, tries, max)).await;
                    tries += 1;
                }
            }
        };
        if let Some(filter) = store.churn_filter() {
            filter.written(&hash, &record.id, ok);
        }
    });
}

fn spawn(f: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(f);
    }
}
