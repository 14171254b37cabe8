//! Repeats (replays and joins) are counted in memory per record and written to the
//! ledger in sums, one `record_repeats` per record every [`REPEAT_FLUSH`] and on
//! the engine's drain (`Engine::drain`), so that a replay never waits on, nor queues
//! behind, a ledger write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use oncely_core::RecordId;
use oncely_store::{Repeat, RepeatKind, Store, StoreError};

/// How often the repeats counted in memory are written to the ledger.
pub const REPEAT_FLUSH: Duration = Duration::from_millis(200);

/// At most this many repeat events wait in memory (over every record) while the ledger
/// cannot take them; beyond it a repeat is still counted, only not listed in statements.
const MAX_PENDING_EVENTS: usize = 100_000;

/// One record's repeats not yet written.
#[derive(Debug, Default)]
struct PendingRepeats {
    /// Each one, with its time and kind (for statements).
    events: Vec<Repeat>,
    /// Repeats over [`MAX_PENDING_EVENTS`]: counted, not kept one by one.
    unlisted: u64,
    unlisted_units: u64,
}

/// Repeats per record not yet written, and how many events they hold.
#[derive(Debug, Default)]
struct Pending {
    by_record: HashMap<RecordId, PendingRepeats>,
    events: usize,
}

/// Repeats counted in memory until the next flush. The flushing task holds only a weak
/// reference, so it ends with the guard.
pub(crate) struct RepeatTally {
    store: Arc<dyn Store>,
    pending: Mutex<Pending>,
    /// Held while a flush writes, so that [`RepeatTally::flush`] returns only once every
    /// repeat taken before it (by the background task too) is in the ledger.
    writing: tokio::sync::Mutex<()>,
    pub(crate) flusher: AtomicBool,
    pub(crate) max_events: usize,
}

impl RepeatTally {
    pub(crate) fn new(store: Arc<dyn Store>) -> RepeatTally {
        RepeatTally {
            store,
            pending: Mutex::new(Pending::default()),
            writing: tokio::sync::Mutex::new(()),
            flusher: AtomicBool::new(false),
            max_events: MAX_PENDING_EVENTS,
        }
    }

    /// Counts one repeat of `id` worth `units`, and starts the flushing task on first use
    /// (on the caller's runtime). No store call: the repeat is written with the next flush.
    pub(crate) fn add(self: &Arc<Self>, id: &RecordId, kind: RepeatKind, units: u64) {
        {
            let mut pending = self.pending.lock().expect("repeat tally lock");
            let keep = pending.events < self.max_events;
            if keep {
                pending.events += 1;
            }
            let entry = pending.by_record.entry(id.clone()).or_default();
            if keep {
                entry.events.push(Repeat {
                    // The gateway's own clock: no store round trip on the answer's path.
                    at: oncely_store::clock::system_now(),
                    kind,
                    units,
                });
            } else {
                entry.unlisted += 1;
                entry.unlisted_units += units;
            }
        }
        if !self.flusher.load(Ordering::Relaxed) && !self.flusher.swap(true, Ordering::AcqRel) {
            let tally = Arc::downgrade(self);
            tokio::spawn(flush_every(tally, REPEAT_FLUSH));
        }
    }

    pub(crate) async fn flush(&self) {
        let _writing = self.writing.lock().await;
        let taken = std::mem::take(&mut *self.pending.lock().expect("repeat tally lock"));
        for (id, mut repeats) in taken.by_record {
            let mut result = Ok(());
            if !repeats.events.is_empty() {
                result = self.store.record_repeats(&id, &repeats.events).await;
                if result.is_ok() {
                    repeats.events.clear();
                }
            }
            if result.is_ok() && repeats.unlisted > 0 {
                result = self
                    .store
                    .add_repeats(&id, repeats.unlisted, repeats.unlisted_units)
                    .await;
                if result.is_ok() {
                    repeats.unlisted = 0;
                    repeats.unlisted_units = 0;
                }
            }
            match result {
                Ok(()) => {}
                // The record is gone (purged): nothing left to count on.
                Err(StoreError::NotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(target: "oncely::store", record = %id, repeats = repeats.events.len() as u64 + repeats.unlisted, error = %e, "could not count repeats; will retry");
                    let mut pending = self.pending.lock().expect("repeat tally lock");
                    pending.events += repeats.events.len();
                    let entry = pending.by_record.entry(id).or_default();
                    let later = std::mem::replace(entry, repeats);
                    entry.events.extend(later.events);
                    entry.unlisted += later.unlisted;
                    entry.unlisted_units += later.unlisted_units;
                }
            }
        }
    }
}

async fn flush_every(tally: Weak<RepeatTally>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(tally) = tally.upgrade() else { return };
        let idle = tally
            .pending
            .lock()
            .expect("repeat tally lock")
            .by_record
            .is_empty();
        if !idle {
            tally.flush().await;
        }
    }
}
