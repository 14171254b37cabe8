//! Repeats (replays and joins) are counted in memory per record and written to the
//! ledger, one `record_repeats` per record every [`REPEAT_FLUSH`] and on
//! the engine's drain (`Engine::drain`), so that a replay never waits on, nor queues
//! behind, a ledger write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use oncely_core::{Record, RecordId};
use oncely_store::{Repeat, RepeatKind, Store};

/// How often the repeats counted in memory are written to the ledger.
pub const REPEAT_FLUSH: Duration = Duration::from_millis(200);

/// At most this many repeat events wait in memory (over every record) while the ledger
/// cannot take them; beyond it repeats are still counted, summed per record and kind (one
/// event for several, listed in statements as one line).
const MAX_PENDING_EVENTS: usize = 100_000;

/// One record's repeats not yet written.
#[derive(Debug, Default)]
struct PendingRepeats {
    /// The record's principal and route (its repeats are kept even if it left the ledger
    /// before they were written).
    principal: String,
    route: String,
    /// Each one, with its time and kind (for statements).
    events: Vec<Repeat>,
    /// Repeats over [`MAX_PENDING_EVENTS`], summed per kind (joined, replayed).
    summed: [Option<Repeat>; 2],
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

    /// Counts one repeat of `record` worth `units`, and starts the flushing task on first
    /// use (on the caller's runtime). No store call: the repeat is written with the next
    /// flush.
    pub(crate) fn add(self: &Arc<Self>, record: &Record, kind: RepeatKind, units: u64) {
        {
            let mut pending = self.pending.lock().expect("repeat tally lock");
            let keep = pending.events < self.max_events;
            if keep {
                pending.events += 1;
            }
            let entry = pending
                .by_record
                .entry(record.id.clone())
                .or_insert_with(|| PendingRepeats {
                    principal: record.principal.clone(),
                    route: record.route.clone(),
                    ..PendingRepeats::default()
                });
            let repeat = Repeat {
                // The gateway's own clock: no store round trip on the answer's path.
                at: oncely_store::clock::system_now(),
                kind,
                count: 1,
                units,
            };
            if keep {
                entry.events.push(repeat);
            } else {
                let slot = &mut entry.summed[kind as usize];
                match slot {
                    Some(sum) => {
                        sum.count += 1;
                        sum.units += units;
                    }
                    None => *slot = Some(repeat),
                }
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
        for (id, repeats) in taken.by_record {
            let mut all = repeats.events.clone();
            all.extend(repeats.summed.iter().flatten().copied());
            if all.is_empty() {
                continue;
            }
            let written = self
                .store
                .record_repeats(&id, &repeats.principal, &repeats.route, &all)
                .await;
            if let Err(e) = written {
                let n: u64 = all.iter().map(|r| r.count).sum();
                tracing::warn!(target: "oncely::store", record = %id, repeats = n, error = %e, "could not count repeats; will retry");
                let mut pending = self.pending.lock().expect("repeat tally lock");
                pending.events += repeats.events.len();
                let entry = pending.by_record.entry(id).or_default();
                let later = std::mem::replace(entry, repeats);
                entry.events.extend(later.events);
                for (kind, sum) in later.summed.into_iter().enumerate() {
                    let Some(sum) = sum else { continue };
                    match &mut entry.summed[kind] {
                        Some(mine) => {
                            mine.count += sum.count;
                            mine.units += sum.units;
                        }
                        slot => *slot = Some(sum),
                    }
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
