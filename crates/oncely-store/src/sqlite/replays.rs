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
//!
//! A record enters when a claim or a lookup reads it, not when it completes: most
//! completions are never replayed, and caching each one cost about 4 us of CPU per fresh
//! request, plus a drop of the whole cache each time it filled.

use std::collections::HashMap;
use std::sync::Mutex;

use oncely_core::{Record, RecordId, Scope, Timestamp};

#[cfg(test)]
use crate::replays::MAX_BODY;
use crate::replays::{small_enough, MAX_RECORDS};

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
        let small = small_enough(record);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use oncely_core::{ClaimSpec, Class, Completion, FingerprintBuilder, StoredResponse};

    use super::*;

    fn completed(key: &str, body: usize) -> Record {
        let spec = ClaimSpec {
            scope: Scope::new("p", "POST /x"),
            key: key.into(),
            fingerprint: FingerprintBuilder::new("p", "POST", "/x").body(b"{}", &[]),
            class: Class::Write,
            route: "POST /x".into(),
            principal: "p".into(),
            owner: "o".into(),
            lease: Duration::from_secs(30),
            workflow_id: None,
        };
        let mut r = Record::new_claim(RecordId(format!("r-{key}")), &spec, Timestamp(0));
        let done = Completion {
            response: StoredResponse {
                status: 200,
                headers: vec![],
                body: Some(vec![b'x'; body].into()),
            },
            units: 1,
            window: Duration::from_secs(10),
            replay_until: None,
            provider_request_id: None,
        };
        r.complete(&r.fence().unwrap(), done, Timestamp(0)).unwrap();
        r
    }

    #[test]
    fn serves_only_replayable_records() {
        let cache = ReplayCache::default();
        let r = completed("a", 10);
        cache.offer(cache.epoch(), &r, Timestamp(1));
        assert_eq!(cache.get(&r.scope, "a", Timestamp(5)), Some(r.clone()));
        assert_eq!(cache.get(&r.scope, "a", Timestamp(10_000)), None, "expired");
        let big = completed("big", MAX_BODY + 1);
        cache.offer(cache.epoch(), &big, Timestamp(1));
        assert_eq!(cache.get(&big.scope, "big", Timestamp(1)), None);
    }

    #[test]
    fn a_read_older_than_an_invalidation_is_not_kept() {
        let cache = ReplayCache::default();
        let r = completed("a", 10);
        let before = cache.epoch();
        cache.forget(&r.id);
        cache.offer(before, &r, Timestamp(1));
        assert!(cache.is_empty());
        cache.offer(cache.epoch(), &r, Timestamp(1));
        assert!(!cache.is_empty());
        cache.forget(&r.id);
        assert!(cache.is_empty());
        cache.offer(cache.epoch(), &r, Timestamp(1));
        cache.clear();
        assert_eq!(cache.get(&r.scope, "a", Timestamp(1)), None);
    }
}
