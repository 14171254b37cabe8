//! The streaming judgement: which request repeated an earlier identical one.
//!
//! The rule is the gateway's. The first request of an identity is the *original*: it
//! executes, and its record lives from its start until its completion (`ts + duration_ms`)
//! plus the window. An identical request that starts while the record lives is a
//! *repeat*: **during** when it starts before the original completed (a guard would have
//! joined it to the running original), **after** otherwise (a guard would have replayed
//! the stored answer). Repeats do not renew the record, exactly as replays do not. The
//! first identical request at or after the record's end is a new original.
//!
//! Memory is bounded by the window: originals are kept in a map keyed by fingerprint and
//! dropped once the newest time seen has passed their end of window (checked in the order
//! they were made, so one may outstay its window by at most the longest `duration_ms`
//! before it; the verdict never depends on this, only memory does); per-principal sums
//! and a short list of the most repeated originals are all that outlive them.
//!
//! A repeat is also **churned** when its line carries an Idempotency-Key that no earlier
//! request of its original (the original and its repeats so far) carried, while one of
//! them carried another: a retry loop that made up a key for the attempt. A repeat under
//! a key seen before is a retry done right, and a line without a key is never churned;
//! both are repeats all the same, as before (the key is not part of the identity).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroU64;

use crate::canon::RequestKey;
use crate::order::{Located, Unreadable};
use crate::report::{DelayStats, ListedRepeat, PrincipalTotals, TopRepeat};

/// At most this many unreadable lines are kept as examples (all are counted).
pub(crate) const UNREADABLE_EXAMPLES: usize = 10;

/// Request keys are SHA-256 bits already: any 64 of them are a good hash.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(17) ^ u64::from_le_bytes(word);
        }
    }
    fn write_u128(&mut self, key: u128) {
        self.0 ^= key as u64;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type KeyMap<V> = HashMap<RequestKey, V, BuildHasherDefault<KeyHasher>>;

/// Hashed Idempotency-Keys (SipHash bits already).
type IdempotencyKeys = HashSet<NonZeroU64, BuildHasherDefault<KeyHasher>>;

/// FNV-1a for principal names: short keys, looked up once per line; no adversary can
/// slow a local audit down by choosing principals.
struct NameHasher(u64);

impl Default for NameHasher {
    fn default() -> NameHasher {
        NameHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A request that executed, while its record lives.
struct Original {
    ts: i64,
    end: i64,
    principal: u32,
    file: u32,
    line: u64,
    units: u64,
    repeats: u32,
    during: u32,
    repeat_units: u64,
    max_delay_ms: u64,
    /// The first Idempotency-Key its requests carried.
    idempotency_key: Option<NonZeroU64>,
    /// Kept only once the original has a repeat (most never do).
    detail: Option<Box<Repeated>>,
}

/// What a repeated original keeps besides its sums.
struct Repeated {
    method: Box<str>,
    path: Box<str>,
    /// The other Idempotency-Keys its repeats carried.
    keys: IdempotencyKeys,
    /// Its churned repeats.
    churned: u32,
}

impl Original {
    /// Whether a repeat under `key` churned (see the module's documentation), noting the
    /// key. Called once the original's `detail` exists.
    fn churns(&mut self, key: Option<NonZeroU64>) -> bool {
        let Some(key) = key else { return false };
        let Some(detail) = self.detail.as_deref_mut() else {
            return false;
        };
        let Some(first) = self.idempotency_key else {
            self.idempotency_key = Some(key);
            return false;
        };
        let new = key != first && detail.keys.insert(key);
        if new {
            detail.churned += 1;
        }
        new
    }
}

/// Everything counted so far.
pub(crate) struct Detector {
    window_ms: i64,
    top_n: usize,
    /// Repeats kept per principal for statements.
    listed_n: usize,
    originals: KeyMap<Original>,
    /// (end of window, key, start) in the order originals were made. The start tells an
    /// entry from a later original of the same key (which always starts later).
    expiries: VecDeque<(i64, RequestKey, i64)>,
    frontier: i64,
    principal_ids: HashMap<Box<str>, u32, BuildHasherDefault<NameHasher>>,
    pub(crate) principals: Vec<PrincipalTotals>,
    pub(crate) top: Vec<TopRepeat>,
    pub(crate) during: DelayStats,
    pub(crate) after: DelayStats,
    pub(crate) out_of_order: u64,
    pub(crate) units_missing: u64,
    /// Requests whose line carries an Idempotency-Key.
    pub(crate) keyed: u64,
    pub(crate) unreadable: u64,
    pub(crate) unreadable_examples: Vec<Unreadable>,
    pub(crate) peak_originals: usize,
}

impl Detector {
    pub(crate) fn new(window_ms: i64, top_n: usize, listed_n: usize) -> Detector {
        Detector {
            window_ms,
            top_n,
            listed_n,
            originals: KeyMap::default(),
            expiries: VecDeque::new(),
            frontier: i64::MIN,
            principal_ids: HashMap::default(),
            principals: Vec::new(),
            top: Vec::new(),
            during: DelayStats::default(),
            after: DelayStats::default(),
            out_of_order: 0,
            units_missing: 0,
            keyed: 0,
            unreadable: 0,
            unreadable_examples: Vec::new(),
            peak_originals: 0,
        }
    }

    /// Counts a line that could not be read.
    pub(crate) fn unreadable(&mut self, u: Unreadable) {
        self.unreadable += 1;
        if self.unreadable_examples.len() < UNREADABLE_EXAMPLES {
            self.unreadable_examples.push(u);
        }
    }

    /// Judges one request. Requests are expected in time order; one that is not is
    /// still judged against what is remembered, and counted in `out_of_order`.
    pub(crate) fn observe(&mut self, located: Located) {
        let Located { req, file, line } = located;
        let principal = self.principal_id(req.names.principal());
        let units = match req.units {
            Some(u) => u,
            None => {
                self.units_missing += 1;
                1
            }
        };
        if req.idempotency_key.is_some() {
            self.keyed += 1;
        }
        let totals = &mut self.principals[principal as usize];
        totals.requests += 1;
        // Sums saturate: absurd `units` in a log must not crash the audit.
        totals.units = totals.units.saturating_add(units);

        if req.ts > self.frontier {
            self.frontier = req.ts;
            self.evict();
        } else if req.ts < self.frontier {
            self.out_of_order += 1;
        }

        let end = req
            .ts
            .saturating_add(req.duration_ms.min(i64::MAX as u64) as i64);
        let original = Original {
            ts: req.ts,
            end,
            principal,
            file,
            line,
            units,
            repeats: 0,
            during: 0,
            repeat_units: 0,
            max_delay_ms: 0,
            idempotency_key: req.idempotency_key,
            detail: None,
        };
        // One probe of the table per request: it is large and cold, so probes cost.
        let replaced = match self.originals.entry(req.key) {
            Entry::Vacant(slot) => {
                slot.insert(original);
                None
            }
            Entry::Occupied(mut slot) => {
                let o = slot.get_mut();
                let lives_until = o.end.saturating_add(self.window_ms);
                if req.ts < lives_until && req.ts.saturating_add(self.window_ms) > o.ts {
                    let during = req.ts < o.end;
                    let delay = if during {
                        req.ts.saturating_sub(o.ts).max(0)
                    } else {
                        req.ts - o.end
                    } as u64;
                    o.repeats += 1;
                    o.repeat_units = o.repeat_units.saturating_add(units);
                    o.max_delay_ms = o.max_delay_ms.max(delay);
                    if during {
                        o.during += 1;
                        self.during.add(delay);
                    } else {
                        self.after.add(delay);
                    }
                    if o.detail.is_none() {
                        o.detail = Some(Box::new(Repeated {
                            method: req.names.method().into(),
                            path: req.names.path().into(),
                            keys: IdempotencyKeys::default(),
                            churned: 0,
                        }));
                    }
                    let churned = o.churns(req.idempotency_key);
                    let totals = &mut self.principals[principal as usize];
                    totals.duplicate_requests += 1;
                    totals.duplicate_units = totals.duplicate_units.saturating_add(units);
                    if during {
                        totals.during += 1;
                    } else {
                        totals.after += 1;
                    }
                    if churned {
                        totals.churned += 1;
                    }
                    // Bounded: the first `listed_n` per principal; the sums stay exact.
                    if totals.repeats.len() < self.listed_n {
                        totals.repeats.push(ListedRepeat {
                            ts: req.ts,
                            method: req.names.method().into(),
                            path: req.names.path().into(),
                            units,
                            during,
                        });
                    }
                    return;
                }
                if req.ts < o.ts {
                    // A straggler from well before the remembered original: it executed on
                    // its own, and the newer record stays.
                    return;
                }
                Some(std::mem::replace(o, original))
            }
        };
        if let Some(old) = replaced {
            self.retire(req.key, old);
        }
        self.expiries
            .push_back((end.saturating_add(self.window_ms), req.key, req.ts));
        self.peak_originals = self.peak_originals.max(self.originals.len());
    }

    /// Forgets originals whose record has ended by the newest time seen.
    fn evict(&mut self) {
        while let Some(&(until, key, start)) = self.expiries.front() {
            if until > self.frontier {
                break;
            }
            self.expiries.pop_front();
            if let Entry::Occupied(slot) = self.originals.entry(key) {
                if slot.get().ts == start {
                    let o = slot.remove();
                    self.retire(key, o);
                }
            }
        }
    }

    /// Ends the run: every remembered original is retired.
    pub(crate) fn finish(&mut self) {
        let originals = std::mem::take(&mut self.originals);
        for (key, o) in originals {
            self.retire(key, o);
        }
        self.expiries.clear();
        self.top.sort_by(TopRepeat::rank);
    }

    /// An original leaves memory; if it was repeated, it may join the top list.
    fn retire(&mut self, key: RequestKey, o: Original) {
        if o.repeats == 0 || self.top_n == 0 {
            return;
        }
        if self.top.len() >= self.top_n {
            let weakest = self
                .top
                .iter()
                .enumerate()
                .max_by(|a, b| TopRepeat::rank(a.1, b.1))
                .map(|(i, _)| i)
                .expect("top is not empty");
            let w = &self.top[weakest];
            if (u64::from(o.repeats), o.repeat_units) <= (w.repeats, w.repeat_units) {
                return;
            }
            self.top.swap_remove(weakest);
        }
        let (method, path, churned) = o
            .detail
            .map(|d| (d.method.into(), d.path.into(), d.churned))
            .unwrap_or_default();
        self.top.push(TopRepeat {
            principal: self.principals[o.principal as usize].principal.clone(),
            method,
            path,
            fingerprint: key.to_hex(),
            first_seen: oncely_core::Timestamp(o.ts).to_rfc3339(),
            duration_ms: (o.end - o.ts) as u64,
            source_file: o.file,
            source: String::new(),
            line: o.line,
            units: o.units,
            repeats: u64::from(o.repeats),
            repeat_units: o.repeat_units,
            during: u64::from(o.during),
            after: u64::from(o.repeats - o.during),
            churned: u64::from(churned),
            max_delay_ms: o.max_delay_ms,
        });
    }

    fn principal_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.principal_ids.get(name) {
            return id;
        }
        let id = self.principals.len() as u32;
        self.principal_ids.insert(name.into(), id);
        self.principals.push(PrincipalTotals {
            principal: name.to_string(),
            ..PrincipalTotals::default()
        });
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::line::Request;

    fn at(ts: i64, body: u8, duration_ms: u64) -> Located {
        Located {
            req: Request {
                ts,
                duration_ms,
                units: Some(10),
                names: crate::line::Names::new("p", "POST", "/x"),
                key: RequestKey(u128::from(body)),
                idempotency_key: None,
            },
            file: 0,
            line: ts as u64,
        }
    }

    /// A request of body 1 at `ts` under Idempotency-Key `key` (0: none).
    fn keyed(ts: i64, key: u64) -> Located {
        let mut l = at(ts, 1, 0);
        l.req.idempotency_key = NonZeroU64::new(key);
        l
    }

    /// Churned repeats, and keyed requests, of requests of body 1 under these keys, a
    /// second apart, with a window of `window_ms`.
    fn churned(window_ms: i64, keys: &[u64]) -> (u64, u64) {
        let mut d = Detector::new(window_ms, 10, 0);
        for (i, &key) in keys.iter().enumerate() {
            d.observe(keyed(i as i64 * 1_000, key));
        }
        d.finish();
        let churned = d.top.first().map_or(0, |t| t.churned);
        assert_eq!(d.principals[0].churned, churned);
        (churned, d.keyed)
    }

    #[test]
    fn a_repeat_under_a_key_made_up_anew_is_churned() {
        let day = 86_400_000;
        // Three keys for one request: the second and third attempts churned.
        assert_eq!(churned(day, &[1, 2, 3]), (2, 3));
        // A retry under the same key is a repeat, not churned.
        assert_eq!(churned(day, &[1, 1]), (0, 2));
        // A key is churned the first time it comes, not when it is used again.
        assert_eq!(churned(day, &[1, 2, 2, 1, 3]), (2, 5));
        // No keys, no churn; a keyless original gives no key to differ from.
        assert_eq!(churned(day, &[0, 0, 0]), (0, 0));
        assert_eq!(churned(day, &[0, 1, 0, 2]), (1, 2));
        // Outside the window a new key starts a new original: nothing churned.
        assert_eq!(churned(1_000, &[1, 2]), (0, 2));
        let mut d = Detector::new(day, 10, 0);
        d.observe(keyed(0, 1));
        d.observe(keyed(1, 2));
        assert_eq!(d.principals[0].duplicate_requests, 1, "still a repeat");
    }

    #[test]
    fn originals_are_forgotten_once_their_window_has_passed() {
        let mut d = Detector::new(1_000, 10, 0);
        d.observe(at(0, 1, 500));
        d.observe(at(100, 2, 0));
        assert_eq!(d.originals.len(), 2);
        // Key 2's record ended at 1_100, but it waits behind key 1's (ends 1_500) in the
        // queue: eviction lags by at most the longest duration.
        d.observe(at(1_100, 3, 0));
        assert_eq!(d.originals.len(), 3);
        d.observe(at(1_499, 1, 0)); // still key 1's window (500 + 1_000)
        assert_eq!(d.principals[0].duplicate_requests, 1);
        d.observe(at(1_500, 4, 0));
        assert_eq!(d.originals.len(), 2, "keys 1 and 2 forgotten, 3 and 4 kept");
        assert_eq!(d.top.len(), 1, "key 1 retired into the top list");
        assert_eq!(d.top[0].repeats, 1);
        assert_eq!(d.top[0].max_delay_ms, 999);
    }

    #[test]
    fn a_straggler_from_before_the_window_neither_repeats_nor_replaces() {
        let mut d = Detector::new(1_000, 10, 0);
        d.observe(at(10_000, 1, 0));
        d.observe(at(2_000, 1, 0));
        d.observe(at(10_500, 1, 0));
        assert_eq!(d.out_of_order, 1);
        assert_eq!(d.principals[0].requests, 3);
        assert_eq!(d.principals[0].duplicate_requests, 1);
        d.finish();
        assert_eq!(
            d.top[0].first_seen,
            oncely_core::Timestamp(10_000).to_rfc3339()
        );
    }

    #[test]
    fn statements_list_the_first_repeats_and_count_them_all() {
        let mut d = Detector::new(1_000, 10, 2);
        d.observe(at(0, 1, 500));
        d.observe(at(100, 1, 0)); // during
        d.observe(at(600, 1, 0)); // after
        d.observe(at(700, 1, 0)); // after, beyond the cap
        let p = &d.principals[0];
        assert_eq!((p.duplicate_requests, p.duplicate_units), (3, 30));
        let listed: Vec<(i64, bool, u64)> = p
            .repeats
            .iter()
            .map(|r| (r.ts, r.during, r.units))
            .collect();
        assert_eq!(listed, [(100, true, 10), (600, false, 10)]);
        assert_eq!(
            (p.repeats[0].method.as_str(), p.repeats[0].path.as_str()),
            ("POST", "/x")
        );
    }

    #[test]
    fn the_top_list_keeps_the_most_repeated() {
        let mut d = Detector::new(1_000_000, 2, 0);
        for (key, repeats) in [(1u8, 1), (2, 3), (3, 2), (4, 1)] {
            let base = i64::from(key) * 10;
            for r in 0..=repeats {
                d.observe(at(base + r, key, 0));
            }
        }
        d.finish();
        let repeats: Vec<u64> = d.top.iter().map(|t| t.repeats).collect();
        assert_eq!(repeats, [3, 2]);
    }
}
