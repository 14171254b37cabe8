//! A cache of completed records, so that a replay on PostgreSQL costs no round trip.
//!
//! A completed record does not change until its window ends (no transition applies to
//! it; only its repeat counters move, and a claim answered from a completed record does
//! not read them), and only an expired record can be purged or renewed under its key.
//! So a claim that finds a completed record can be answered from memory, on any instance
//! sharing the database, for as long as the record is replayable. The cache stays honest
//! this way:
//!
//! - it answers only [`Ledger::claim`](crate::Ledger::claim) (not `get`, `lookup` or
//!   `list`, which show the counters), and only with records that were read completed,
//!   i.e. from a durable completion;
//! - an entry keeps the database's time when it was read, and "now" is that time plus the
//!   monotonic time since (plus any change of the store clock's offset, which tests
//!   step). A step of this host's wall clock cannot stretch a record's window; the
//!   entry counts as expired [`MARGIN_MS`] before the record does, so that the drift
//!   between this host's monotonic clock and the database's clock cannot serve a record
//!   that another instance already purged;
//! - an entry is read again from the database after [`MAX_AGE`] at the latest;
//! - at most [`MAX_RECORDS`] records with bodies of at most [`MAX_BODY`] are kept.
//!
//! A record enters when a claim reads it completed, not when this instance completes it:
//! most completions are never replayed, and caching each one cost CPU on every fresh
//! request.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use oncely_core::{Record, Scope, Timestamp};

#[cfg(test)]
use crate::replays::MAX_BODY;
use crate::replays::{small_enough, MAX_RECORDS};
/// An entry is read again from the database at least this often.
pub(super) const MAX_AGE: Duration = Duration::from_secs(60);
/// An entry counts as expired this long before its record does.
pub(super) const MARGIN_MS: i64 = 1_000;

struct Entry {
    record: Record,
    /// The database's time (with the clock offset) when the record was read.
    db_now: i64,
    /// The clock offset then.
    offset: i64,
    /// When it was read, on this host's monotonic clock.
    at: Instant,
}

/// Replayable records by a hash of `(scope, key)` (checked against the record on a hit).
#[derive(Default)]
pub(super) struct ReplayCache {
    entries: Mutex<HashMap<u64, Entry>>,
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache").finish_non_exhaustive()
    }
}

fn slot(scope: &Scope, key: &str) -> u64 {
    let mut h = DefaultHasher::new();
    scope.as_str().hash(&mut h);
    key.hash(&mut h);
    h.finish()
}

impl ReplayCache {
    /// The completed record holding `(scope, key)`, if cached and still replayable;
    /// `offset` is the store clock's offset now.
    pub(super) fn get(&self, scope: &Scope, key: &str, offset: i64) -> Option<Record> {
        let slot = slot(scope, key);
        let mut entries = self.entries.lock().expect("replay cache lock");
        let entry = entries.get(&slot)?;
        if entry.record.scope != *scope || entry.record.key != key {
            return None;
        }
        let age = entry.at.elapsed();
        let now = entry
            .db_now
            .saturating_add(age.as_millis().min(i64::MAX as u128) as i64)
            .saturating_add(offset.saturating_sub(entry.offset))
            .saturating_add(MARGIN_MS);
        if age > MAX_AGE || !entry.record.is_replayable(Timestamp(now)) {
            entries.remove(&slot);
            return None;
        }
        Some(entry.record.clone())
    }

    /// Keeps `record` if it is completed, small and replayable at `db_now` (the
    /// database's time, with `offset`, when it was read).
    pub(super) fn offer(&self, record: &Record, db_now: i64, offset: i64) {
        let small = small_enough(record);
        if !small || !record.is_replayable(Timestamp(db_now.saturating_add(MARGIN_MS))) {
            return;
        }
        let slot = slot(&record.scope, &record.key);
        let mut entries = self.entries.lock().expect("replay cache lock");
        if entries.len() >= MAX_RECORDS && !entries.contains_key(&slot) {
            entries.clear();
        }
        entries.insert(
            slot,
            Entry {
                record: record.clone(),
                db_now,
                offset,
                at: Instant::now(),
            },
        );
    }

    /// How many records are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().expect("replay cache lock").len()
    }
}

#[cfg(test)]
mod tests {
    use oncely_core::{ClaimSpec, Class, Completion, FingerprintBuilder, RecordId, StoredResponse};

    use super::*;

    fn completed(key: &str, body: usize, at: i64) -> Record {
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
        let mut r = Record::new_claim(RecordId(format!("r-{key}")), &spec, Timestamp(at));
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
        r.complete(&r.fence().unwrap(), done, Timestamp(at))
            .unwrap();
        r
    }

    #[test]
    fn serves_completed_records_until_a_margin_before_expiry() {
        let cache = ReplayCache::default();
        let r = completed("a", 10, 1_000);
        cache.offer(&r, 1_000, 0);
        assert_eq!(cache.get(&r.scope, "a", 0), Some(r.clone()));
        assert_eq!(cache.get(&r.scope, "b", 0), None);
        // The store clock steps forward to within the margin of the end of the window.
        assert_eq!(cache.get(&r.scope, "a", 10_000 - MARGIN_MS), None);
        assert_eq!(cache.len(), 0, "an expired entry is dropped");
        // Read close to its expiry: not kept at all.
        cache.offer(&r, 11_000 - MARGIN_MS, 0);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn keeps_neither_large_nor_unfinished_records() {
        let cache = ReplayCache::default();
        let big = completed("big", MAX_BODY + 1, 0);
        cache.offer(&big, 0, 0);
        let mut processing = completed("p", 1, 0);
        processing.state = oncely_core::State::Processing;
        cache.offer(&processing, 0, 0);
        assert_eq!(cache.len(), 0);
    }
}
