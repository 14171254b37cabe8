//! The replay cache of the SQLite and PostgreSQL stores: completed records kept in memory,
//! so that a replay is answered without a blocking thread (SQLite) or a round trip
//! (PostgreSQL).
//!
//! A completed record cannot change until its window ends, except for its repeat
//! counters: no transition applies to it, and only an expired record can be purged or
//! renewed under its key. So a replayable record read once can answer again for as long
//! as it stays replayable. The cache stays honest this way:
//!
//! - it serves a record only while [`Record::is_replayable`] holds at the store's time
//!   plus the backend's [`Limits::margin`], and drops it once it does not;
//! - the store's time is what the caller tells ([`Now::Is`]), or the time of the entry's
//!   read carried forward on this host's monotonic clock ([`Now::SinceRead`]), for a
//!   store whose clock is the database's;
//! - an entry is read again from the store after [`Limits::max_age`] at the latest, when
//!   the backend sets one;
//! - [`ReplayCache::forget`] (one record's counters changed) and [`ReplayCache::clear`]
//!   (another connection committed) bump an epoch, which stops a read that started before
//!   the invalidation from putting its older copy back ([`ReplayCache::offer`]);
//! - at most [`Limits::max_records`] records with bodies of at most
//!   [`Limits::max_body`] are kept; a full cache starts over.
//!
//! A larger record's body is shared, not kept: while one replay of it still holds its
//! body, the cache serves the record with that copy, and a read of the same record (and
//! attempt) gets that copy instead of keeping its own ([`ReplayCache::offer`]). So any
//! number of callers replaying an 8 MB answer at once hold one copy of it and cost one
//! read of the store, not one each (on SQLite, one writer's turn each: 200 of them
//! queued past the store's bound under load). The copy goes once the last of them is
//! done with it, and the record is read from the store again after that: nothing keeps
//! a large body for later.
//!
//! A record enters when a read of the store meets it, not when it completes: most
//! completions are never replayed, and caching each one cost CPU on every fresh request
//! (about 4 us on SQLite, plus a drop of the whole cache each time it filled).
//!
//! Each backend says what it keeps and serves, and when it invalidates: see the `cache`
//! field of the SQLite store and the `replays` field of the PostgreSQL one.

#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncely_core::{Record, RecordId, Scope, Timestamp};

/// Records with bodies larger than this are read from the store each time.
const MAX_BODY: usize = 64 * 1024;

/// At most this many records are kept; a full cache starts over.
const MAX_RECORDS: usize = 16 * 1024;

/// What a backend's cache keeps, and for how long it trusts an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// At most this many records are kept; a full cache starts over.
    pub(crate) max_records: usize,
    /// Records with bodies larger than this are not kept.
    pub(crate) max_body: usize,
    /// An entry counts as expired this long before its record does.
    pub(crate) margin: Duration,
    /// An entry is read again from the store after this long at the latest, if set.
    pub(crate) max_age: Option<Duration>,
}

impl Limits {
    /// [`MAX_RECORDS`] records of at most [`MAX_BODY`], each served until its record
    /// expires.
    pub(crate) const DEFAULT: Limits = Limits {
        max_records: MAX_RECORDS,
        max_body: MAX_BODY,
        margin: Duration::ZERO,
        max_age: None,
    };
}

/// The store's time, as the caller of [`ReplayCache::get`] knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(all(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) enum Now {
    /// The store's clock reads this now (SQLite: the store's clock runs on this host).
    Is(Timestamp),
    /// The store's clock is the database's, which this host reads only in a round trip
    /// (PostgreSQL). For an entry, now is the store's time of its read plus the time
    /// since on this host's monotonic clock, plus any change since of the store clock's
    /// `offset` (tests step it), so a step of this host's wall clock cannot stretch a
    /// record's window.
    SinceRead {
        /// The store clock's offset now, in ms.
        offset: i64,
    },
}

struct Entry {
    /// The record; without its body when the body is `large`.
    record: Record,
    /// The body of a record too large to keep, while a replay holds it.
    large: Option<Weak<Bytes>>,
    /// The store's time when the record was read.
    read_at: Timestamp,
    /// The store clock's offset then, in ms.
    offset: i64,
    /// When it was read, on this host's monotonic clock.
    at: Instant,
}

#[derive(Default)]
struct Entries {
    /// By a hash of `(scope, key)`, checked against the record on a hit.
    by_slot: HashMap<u64, Entry>,
    /// The slot of each record, for [`ReplayCache::forget`].
    slots: HashMap<RecordId, u64>,
}

impl Entries {
    fn remove(&mut self, slot: u64) {
        if let Some(gone) = self.by_slot.remove(&slot) {
            self.slots.remove(&gone.record.id);
        }
    }

    fn clear(&mut self) {
        self.by_slot.clear();
        self.slots.clear();
    }
}

/// Replayable records by `(scope, key)`, within a backend's [`Limits`].
pub(crate) struct ReplayCache {
    limits: Limits,
    entries: Mutex<Entries>,
    /// The body of each replayable record too large to keep, while a replay holds it:
    /// by record, with the attempt it is the answer of.
    large: Mutex<HashMap<RecordId, (u32, Weak<Bytes>)>>,
    /// Bumped by every invalidation, under the `entries` lock.
    epoch: AtomicU64,
}

impl Default for ReplayCache {
    /// A cache within [`Limits::DEFAULT`].
    fn default() -> ReplayCache {
        ReplayCache::new(Limits::DEFAULT)
    }
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn slot(scope: &Scope, key: &str) -> u64 {
    let mut h = DefaultHasher::new();
    scope.as_str().hash(&mut h);
    key.hash(&mut h);
    h.finish()
}

fn millis(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

impl ReplayCache {
    /// An empty cache that keeps and serves records within `limits`.
    pub(crate) fn new(limits: Limits) -> ReplayCache {
        ReplayCache {
            limits,
            entries: Mutex::new(Entries::default()),
            large: Mutex::new(HashMap::new()),
            epoch: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().expect("replay cache lock")
    }

    /// The record holding `(scope, key)` if it is cached and still replayable (a margin
    /// before its expiry) at `now`; an entry that is not any more is dropped.
    pub(crate) fn get(&self, scope: &Scope, key: &str, now: Now) -> Option<Record> {
        let slot = slot(scope, key);
        let mut entries = self.lock();
        let entry = entries.by_slot.get(&slot)?;
        if entry.record.scope != *scope || entry.record.key != key {
            return None;
        }
        let age = entry.at.elapsed();
        let now = match now {
            Now::Is(now) => now.0,
            Now::SinceRead { offset } => entry
                .read_at
                .0
                .saturating_add(millis(age))
                .saturating_add(offset.saturating_sub(entry.offset)),
        };
        let too_old = self.limits.max_age.is_some_and(|max| age > max);
        let until = Timestamp(now.saturating_add(millis(self.limits.margin)));
        let held = match &entry.large {
            None => None,
            // Nobody holds the body any more: read the record again.
            Some(body) => match body.upgrade() {
                None => {
                    entries.remove(slot);
                    return None;
                }
                held => held,
            },
        };
        if too_old || !entry.record.is_replayable(until) {
            entries.remove(slot);
            return None;
        }
        let mut record = entry.record.clone();
        if let (Some(held), Some(response)) = (held, record.response.as_mut()) {
            response.body = Some(Bytes::from_owner(SharedBody(held)));
        }
        Some(record)
    }

    /// The epoch to pass to [`ReplayCache::offer`] for a read that starts now.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Keeps `record`, read at the store's time `read_at` (with the store clock's
    /// `offset` then, in ms), if it is replayable (a margin before its expiry) then, and
    /// nothing was invalidated since `epoch`. A record whose body is too large to keep
    /// gets the copy of its body that a replay of it still holds (or makes its body that
    /// copy), and is kept without it: served while that copy is held.
    pub(crate) fn offer(&self, epoch: u64, record: &mut Record, read_at: Timestamp, offset: i64) {
        let until = Timestamp(read_at.0.saturating_add(millis(self.limits.margin)));
        if !record.is_replayable(until) {
            return;
        }
        let large = self.is_large(record).then(|| self.share_body(record));
        let mut kept = record.clone();
        if let (Some(_), Some(response)) = (&large, kept.response.as_mut()) {
            response.body = None;
        }
        let slot = slot(&record.scope, &record.key);
        let mut entries = self.lock();
        if self.epoch.load(Ordering::SeqCst) != epoch {
            return;
        }
        if entries.by_slot.contains_key(&slot) {
            entries.remove(slot);
        } else if entries.by_slot.len() >= self.limits.max_records {
            entries.clear();
        }
        entries.slots.insert(record.id.clone(), slot);
        entries.by_slot.insert(
            slot,
            Entry {
                record: kept,
                large,
                read_at,
                offset,
                at: Instant::now(),
            },
        );
    }

    /// Gives `record`, when it is replayable at the store's time `now` and its body too
    /// large to keep, the copy of its body a replay still holds (or makes its body that
    /// copy). A store calls it where it reads records one at a time (SQLite's writer), so
    /// that a batch of claims of one record holds one copy, not one each.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn share(&self, record: &mut Record, now: Timestamp) {
        let until = Timestamp(now.0.saturating_add(millis(self.limits.margin)));
        if self.is_large(record) && record.is_replayable(until) {
            self.share_body(record);
        }
    }

    /// The largest body kept.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn max_body(&self) -> usize {
        self.limits.max_body
    }

    /// The body of `attempt` of record `id`, `len` bytes, if a replay still holds it.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn held(&self, id: &RecordId, attempt: u32, len: usize) -> Option<Bytes> {
        let large = self.large.lock().expect("replay bodies lock");
        let held = held_in(&large, id, attempt, len)?;
        Some(Bytes::from_owner(SharedBody(held)))
    }

    /// Whether `record`'s body is too large to keep.
    fn is_large(&self, record: &Record) -> bool {
        record
            .response
            .as_ref()
            .and_then(|r| r.body.as_ref())
            .is_some_and(|b| b.len() > self.limits.max_body)
    }

    /// Gives `record` (replayable, its body too large to keep) the copy of its body a
    /// replay still holds, or makes its body that copy; the copy, weakly.
    fn share_body(&self, record: &mut Record) -> Weak<Bytes> {
        let Some(body) = record.response.as_mut().and_then(|r| r.body.as_mut()) else {
            return Weak::new();
        };
        let mut large = self.large.lock().expect("replay bodies lock");
        if let Some(held) = held_in(&large, &record.id, record.attempt, body.len()) {
            let weak = Arc::downgrade(&held);
            *body = Bytes::from_owner(SharedBody(held));
            return weak;
        }
        if large.len() >= self.limits.max_records {
            large.retain(|_, (_, held)| held.strong_count() > 0);
        }
        let shared = Arc::new(std::mem::take(body));
        let weak = Arc::downgrade(&shared);
        large.insert(record.id.clone(), (record.attempt, weak.clone()));
        *body = Bytes::from_owner(SharedBody(shared));
        weak
    }

    /// Forgets one record (its counters changed).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn forget(&self, id: &RecordId) {
        let mut entries = self.lock();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if let Some(slot) = entries.slots.get(id).copied() {
            entries.remove(slot);
        }
    }

    /// Forgets everything (another connection committed).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn clear(&self) {
        let mut entries = self.lock();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        entries.clear();
    }

    /// Whether nothing is cached.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().by_slot.is_empty()
    }

    /// How many records are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        let entries = self.lock();
        assert_eq!(
            entries.slots.len(),
            entries.by_slot.len(),
            "one slot per entry"
        );
        entries.by_slot.len()
    }
}

/// The body of `attempt` of record `id` in `large`, `len` bytes, if a replay holds it.
fn held_in(
    large: &HashMap<RecordId, (u32, Weak<Bytes>)>,
    id: &RecordId,
    attempt: u32,
    len: usize,
) -> Option<Arc<Bytes>> {
    let (at, held) = large.get(id)?;
    held.upgrade().filter(|h| *at == attempt && h.len() == len)
}

/// A body shared by the replays that hold it (see [`ReplayCache::share_body`]).
struct SharedBody(Arc<Bytes>);

impl AsRef<[u8]> for SharedBody {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use oncely_core::{
        ClaimSpec, Class, Completion, FingerprintBuilder, Identity, State, StoredResponse,
    };

    use super::*;

    /// A record completed at `at` with a window of 10 s and a body of `body` bytes.
    fn completed(key: &str, body: usize, at: i64) -> Record {
        let spec = ClaimSpec {
            identity: Identity::new(
                "p".into(),
                "POST /x".into(),
                Class::Write,
                Some(key.into()),
                FingerprintBuilder::new("p", "POST", "/x").body(b"{}", &[]),
                None,
            ),
            owner: "o".into(),
            lease: Duration::from_secs(30),
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
            trace: None,
        };
        r.complete(&r.fence().unwrap(), done, Timestamp(at))
            .unwrap();
        r
    }

    fn cache() -> ReplayCache {
        ReplayCache::new(Limits::DEFAULT)
    }

    /// PostgreSQL's limits in these tests: served until 1 s before expiry.
    fn with_margin() -> ReplayCache {
        ReplayCache::new(Limits {
            margin: Duration::from_secs(1),
            ..Limits::DEFAULT
        })
    }

    fn offer(cache: &ReplayCache, r: &Record, read_at: i64) {
        cache.offer(cache.epoch(), &mut r.clone(), Timestamp(read_at), 0);
    }

    #[test]
    fn reads_of_a_large_record_share_one_body_while_one_is_held() {
        let cache = cache();
        let r = completed("big", MAX_BODY + 1, 0);
        let body_ptr = |r: &Record| r.response.as_ref().unwrap().body.as_ref().unwrap().as_ptr();
        let (mut a, mut b) = (r.clone(), completed("big", MAX_BODY + 1, 0));
        let mut shared_later = completed("big", MAX_BODY + 1, 0);
        cache.offer(cache.epoch(), &mut a, Timestamp(1), 0);
        cache.offer(cache.epoch(), &mut b, Timestamp(1), 0);
        assert_eq!(
            body_ptr(&a),
            body_ptr(&b),
            "the second read shares the first's body"
        );
        let served = cache.get(&r.scope, &r.key, Now::Is(Timestamp(1)));
        assert_eq!(
            served.as_ref().map(body_ptr),
            Some(body_ptr(&a)),
            "served with the body a replay holds"
        );
        assert_eq!(served.as_ref().map(|s| s.id.clone()), Some(r.id.clone()));
        drop(served);
        cache.share(&mut shared_later, Timestamp(1));
        assert_eq!(
            body_ptr(&shared_later),
            body_ptr(&a),
            "share() shares as offer() does"
        );
        drop(shared_later);
        let mut later = completed("big", MAX_BODY + 1, 0);
        later.attempt += 1;
        cache.offer(cache.epoch(), &mut later, Timestamp(1), 0);
        assert_ne!(
            body_ptr(&later),
            body_ptr(&a),
            "another attempt's answer is its own"
        );
        drop((a, b, later));
        let mut c = completed("big", MAX_BODY + 1, 0);
        let own = body_ptr(&c);
        cache.offer(cache.epoch(), &mut c, Timestamp(1), 0);
        assert_eq!(
            body_ptr(&c),
            own,
            "nothing held it: the new read's body is the copy"
        );
        // An expired record shares nothing.
        let mut old = completed("big", MAX_BODY + 1, 0);
        let own = body_ptr(&old);
        cache.offer(cache.epoch(), &mut old, Timestamp(60_000), 0);
        assert_eq!(body_ptr(&old), own);
    }

    #[test]
    fn serves_replayable_records_until_they_expire() {
        let cache = cache();
        let r = completed("a", 10, 0);
        offer(&cache, &r, 1);
        assert_eq!(
            cache.get(&r.scope, "a", Now::Is(Timestamp(5))),
            Some(r.clone())
        );
        assert_eq!(cache.get(&r.scope, "b", Now::Is(Timestamp(5))), None);
        let other = Scope::new("q", "POST /x");
        assert_eq!(cache.get(&other, "a", Now::Is(Timestamp(5))), None);
        assert_eq!(
            cache.get(&r.scope, "a", Now::Is(Timestamp(9_999))),
            Some(r.clone())
        );
        assert_eq!(cache.get(&r.scope, "a", Now::Is(Timestamp(10_000))), None);
        assert_eq!(cache.len(), 0, "an expired entry is dropped");
        // Read after its expiry: not kept at all.
        offer(&cache, &r, 10_000);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_margin_ends_service_before_the_record_expires() {
        let cache = with_margin();
        let r = completed("a", 10, 1_000);
        offer(&cache, &r, 1_000);
        let since_read = Now::SinceRead { offset: 0 };
        assert_eq!(cache.get(&r.scope, "a", since_read), Some(r.clone()));
        // The store clock's offset steps to within the margin of the end of the window.
        let stepped = Now::SinceRead {
            offset: 10_000 - 1_000,
        };
        assert_eq!(cache.get(&r.scope, "a", stepped), None);
        assert_eq!(cache.len(), 0, "an expired entry is dropped");
        // Read within the margin of its expiry: not kept at all.
        offer(&cache, &r, 11_000 - 1_000);
        assert_eq!(cache.len(), 0);
        offer(&cache, &r, 11_000 - 1_001);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get(&r.scope, "a", Now::Is(Timestamp(10_000))), None);
    }

    #[test]
    fn since_read_counts_from_the_read_and_the_offset_at_the_read() {
        let cache = cache();
        let r = completed("a", 10, 0);
        // Read at 9 s with the clock 5 s ahead: 1 s of the window is left, and only a
        // move of the offset since the read counts (forward or back).
        cache.offer(cache.epoch(), &mut r.clone(), Timestamp(9_000), 5_000);
        let same = Now::SinceRead { offset: 5_000 };
        assert_eq!(cache.get(&r.scope, "a", same), Some(r.clone()));
        let back = Now::SinceRead { offset: 0 };
        assert_eq!(cache.get(&r.scope, "a", back), Some(r.clone()));
        let ahead = Now::SinceRead { offset: 6_000 };
        assert_eq!(cache.get(&r.scope, "a", ahead), None);
    }

    #[test]
    fn entries_older_than_the_max_age_are_read_again() {
        let cache = ReplayCache::new(Limits {
            max_age: Some(Duration::from_millis(1)),
            ..Limits::DEFAULT
        });
        let r = completed("a", 10, 0);
        offer(&cache, &r, 0);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(cache.get(&r.scope, "a", Now::Is(Timestamp(0))), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn keeps_no_unfinished_record_and_a_large_one_only_while_its_body_is_held() {
        let cache = cache();
        let mut processing = completed("p", 1, 0);
        processing.state = State::Processing;
        offer(&cache, &processing, 0);
        assert_eq!(cache.len(), 0);
        offer(&cache, &completed("max", MAX_BODY, 0), 0);
        assert_eq!(cache.len(), 1);
        let mut big = completed("big", MAX_BODY + 1, 0);
        cache.offer(cache.epoch(), &mut big, Timestamp(0), 0);
        let now = Now::Is(Timestamp(1));
        assert_eq!(cache.get(&big.scope, "big", now), Some(big.clone()));
        drop(big);
        assert_eq!(
            cache.get(&completed("big", 1, 0).scope, "big", now),
            None,
            "nobody holds the body: read again"
        );
        assert_eq!(cache.len(), 1, "and its entry is dropped");
    }

    #[test]
    fn is_bounded_and_starts_over_when_full() {
        let cache = ReplayCache::new(Limits {
            max_records: 3,
            ..Limits::DEFAULT
        });
        let records: Vec<Record> = (0..4).map(|i| completed(&format!("k{i}"), 1, 0)).collect();
        for r in &records[..3] {
            offer(&cache, r, 0);
        }
        assert_eq!(cache.len(), 3);
        // Read again: replaced in place, nothing dropped.
        offer(&cache, &records[0], 1);
        assert_eq!(cache.len(), 3);
        // A fourth record: the full cache starts over with it.
        offer(&cache, &records[3], 0);
        assert_eq!(cache.len(), 1);
        let now = Now::Is(Timestamp(1));
        assert_eq!(
            cache.get(&records[3].scope, "k3", now),
            Some(records[3].clone())
        );
        assert_eq!(cache.get(&records[0].scope, "k0", now), None);
    }

    #[test]
    fn forget_and_clear_evict_and_stop_older_reads() {
        let cache = cache();
        let a = completed("a", 10, 0);
        let b = completed("b", 10, 0);
        let before = cache.epoch();
        cache.forget(&a.id);
        cache.offer(before, &mut a.clone(), Timestamp(1), 0);
        assert!(cache.is_empty(), "read before the invalidation");
        offer(&cache, &a, 1);
        offer(&cache, &b, 1);
        cache.forget(&a.id);
        assert_eq!(cache.len(), 1);
        let now = Now::Is(Timestamp(1));
        assert_eq!(cache.get(&a.scope, "a", now), None);
        assert_eq!(cache.get(&b.scope, "b", now), Some(b.clone()));
        let before = cache.epoch();
        cache.clear();
        assert!(cache.is_empty());
        cache.offer(before, &mut b.clone(), Timestamp(1), 0);
        assert!(cache.is_empty(), "read before the clear");
    }
}
