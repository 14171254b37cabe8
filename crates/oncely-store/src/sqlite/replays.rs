//! A cache of completed records, so that a replay does not wait for a blocking thread.
//!
//! A completed record cannot change until its window ends, except for its repeat
//! counters: no transition applies to it, and a claim renews the key only after
//! expiry. So a replayable record read once can answer `lookup` and `claim` again without
//! touching the file. The cache stays honest this way:
//!
//! - it serves a record only while [`Record::is_replayable`] holds at the store's `now`;
//! - this instance's `add_repeats` forgets the record after its commit;
//! - the writer clears the cache whenever another connection (another instance or
//!   process) has committed, which it sees from `PRAGMA data_version` after each group
//!   and every few milliseconds while the cache is not empty; so counters another
//!   instance added show up within that interval;
//! - an epoch, bumped by every forget and clear, stops a read that started before an
//!   invalidation from putting its older copy back.

use std::collections::HashMap;
use std::sync::Mutex;

use oncely_core::{Record, RecordId, Scope, Timestamp};

/// Records with bodies larger than this are read from the file each time.
const MAX_BODY: usize = 64 * 1024;
/// At most this many records are kept; a full cache starts over.
const MAX_RECORDS: usize = 16 * 1024;

#[derive(Debug, Default)]
struct Entries {
    epoch: u64,
    by_key: HashMap<(Scope, String), Record>,
    keys: HashMap<RecordId, (Scope, String)>,
}

/// Replayable records by `(scope, key)`.
#[derive(Debug, Default)]
pub(super) struct ReplayCache {
    entries: Mutex<Entries>,
}

impl ReplayCache {
    /// The record holding `(scope, key)` if it is cached and replayable at `now`.
    pub(super) fn get(&self, scope: &Scope, key: &str, now: Timestamp) -> Option<Record> {
        let entries = self.entries.lock().expect("replay cache lock");
        entries
            .by_key
            .get(&(scope.clone(), key.to_string()))
            .filter(|r| r.is_replayable(now))
            .cloned()
    }

    /// The epoch to pass to [`ReplayCache::offer`] for a read that starts now.
    pub(super) fn epoch(&self) -> u64 {
        self.entries.lock().expect("replay cache lock").epoch
    }

    /// Keeps `record` if it is replayable and nothing was invalidated since `epoch`.
    pub(super) fn offer(&self, epoch: u64, record: &Record, now: Timestamp) {
        let small = record
            .response
            .as_ref()
            .is_some_and(|r| r.body.as_ref().is_none_or(|b| b.len() <= MAX_BODY));
        if !small || !record.is_replayable(now) {
            return;
        }
        let mut entries = self.entries.lock().expect("replay cache lock");
        if entries.epoch != epoch {
            return;
        }
        if entries.by_key.len() >= MAX_RECORDS {
            entries.by_key.clear();
            entries.keys.clear();
        }
        let at = (record.scope.clone(), record.key.clone());
        entries.keys.insert(record.id.clone(), at.clone());
        entries.by_key.insert(at, record.clone());
    }

    /// Forgets one record (its counters changed).
    pub(super) fn forget(&self, id: &RecordId) {
        let mut entries = self.entries.lock().expect("replay cache lock");
        entries.epoch += 1;
        if let Some(at) = entries.keys.remove(id) {
            entries.by_key.remove(&at);
        }
    }

    /// Forgets everything (another connection committed).
    pub(super) fn clear(&self) {
        let mut entries = self.entries.lock().expect("replay cache lock");
        entries.epoch += 1;
        entries.by_key.clear();
        entries.keys.clear();
    }

    /// Whether nothing is cached.
    pub(super) fn is_empty(&self) -> bool {
        self.entries
            .lock()
            .expect("replay cache lock")
            .by_key
            .is_empty()
    }
}
