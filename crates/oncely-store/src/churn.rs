//! Keys made up for each attempt: a retry under a new client key is the same intention
//! when the record it repeats (another key's, same scope and fingerprint) never reached
//! its caller.
//!
//! The evidence lives in the ledger, in one small table every instance on the database
//! shares, of [`ChurnEntry`]s keyed by a 16-byte hash:
//!
//! - an **undelivered** entry, keyed by [`undelivered_hash`] of the record's scope and
//!   fingerprint, written when the record's caller went away before its answer was written
//!   to its end ([`Ledger::churn_put`], the engine's owner side), and deleted when an
//!   answer of the record reached a caller after all ([`Ledger::churn_forget`]);
//! - a **joined** entry, keyed by the claim hash of `(scope, key)`, written when a made-up
//!   key joined that record: from then on the key names the record too.
//!
//! A claim with a client key on a route that recognises made-up keys goes through
//! [`claim`], which asks the ledger for those entries only when this instance's
//! [`ChurnFilter`] holds the claim's hashes: the filter is what this instance knows of
//! the table (what it wrote, what the database told it, what it read when it opened), so
//! a fresh claim costs what it cost before (one atomic load while nothing is undelivered,
//! two hash probes in memory otherwise), and no B-tree of the database is probed for it.
//! A backend that shares the table between instances tells every filter of every entry
//! written (PostgreSQL: a notification), and reads the table again after it lost track
//! (a listener reconnected); while it cannot know, its filter is blind and every such
//! claim asks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use oncely_core::{ClaimSpec, Fingerprint, Record, RecordId, Scope, State, Timestamp};

use crate::{Claim, Ledger, Result};

/// What a claim with a made-up key needs of its route: how long after its creation a
/// record whose caller never got its answer may be joined (`churn_window`), and how long a
/// key that joined one keeps naming it (the route's replay window, from the join).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Churn {
    /// The route's `churn_window` (never zero: a zero window turns churn off).
    pub window: Duration,
    /// The route's replay window.
    pub keep: Duration,
}

/// The two kinds of [`ChurnEntry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChurnKind {
    /// The record's caller went away before its answer was written to its end.
    Undelivered,
    /// A made-up key that joined the record.
    Joined,
}

impl ChurnKind {
    /// As stored: `undelivered` or `joined`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChurnKind::Undelivered => "undelivered",
            ChurnKind::Joined => "joined",
        }
    }

    /// Parses [`ChurnKind::as_str`].
    pub fn parse(text: &str) -> Option<ChurnKind> {
        match text {
            "undelivered" => Some(ChurnKind::Undelivered),
            "joined" => Some(ChurnKind::Joined),
            _ => None,
        }
    }
}

/// One row of the churn table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChurnEntry {
    /// [`undelivered_hash`] of the record's scope and fingerprint, or the claim hash of the
    /// joined key's `(scope, key)`.
    pub hash: [u8; 16],
    /// The record.
    pub record: RecordId,
    /// Undelivered or joined.
    pub kind: ChurnKind,
    /// The joined key (`None` for an undelivered entry).
    pub key: Option<String>,
    /// When it was written.
    pub at: Timestamp,
    /// Until when it counts: the record's creation plus the churn window (undelivered),
    /// the join plus the replay window (joined). Purged after it.
    pub until: Timestamp,
}

/// The hash an undelivered record is found by: its scope and fingerprint, as a claim
/// hash of a key no client can send (it holds a NUL).
pub fn undelivered_hash(scope: &Scope, fingerprint: &Fingerprint) -> [u8; 16] {
    scope.claim_hash(&format!("\0undelivered\0{}", fingerprint.to_hex()))
}

/// The undelivered entry of `record`, whose caller went away, for a route of `churn`.
pub fn undelivered(record: &Record, churn: Churn, now: Timestamp) -> ChurnEntry {
    ChurnEntry {
        hash: undelivered_hash(&record.scope, &record.fingerprint),
        record: record.id.clone(),
        kind: ChurnKind::Undelivered,
        key: None,
        at: now,
        until: record.created_at.plus(churn.window),
    }
}

/// What this instance knows of the churn table: the hashes of its live entries, and which
/// records are undelivered. See the module docs.
#[derive(Debug, Default)]
pub struct ChurnFilter {
    /// How many entries the map holds: read without the lock on every claim.
    len: AtomicUsize,
    /// Set while the backend cannot know what other instances write (its listener is
    /// down): every claim asks the ledger.
    blind: AtomicBool,
    map: Mutex<HashMap<[u8; 16], Known>>,
    /// Woken when an entry expected here is written (or is not).
    settled: tokio::sync::Notify,
}

/// What the filter knows of one entry.
#[derive(Debug, Clone)]
struct Known {
    record: RecordId,
    kind: ChurnKind,
    until: Timestamp,
    /// Expected by this instance, not written yet: a claim waits for it.
    pending: bool,
}

/// The record id of a placeholder entry: a claim still on its way, whose caller left
/// before it said which record it owns ([`ChurnFilter::expect`]).
pub fn placeholder() -> RecordId {
    RecordId(String::new())
}

/// How long a claim waits for an entry this instance is writing (or for the claim of a
/// caller that went away to land): the store's own bound, `ANSWER_WITHIN`.
const PENDING_WAIT: Duration = Duration::from_secs(10);

impl ChurnFilter {
    /// Whether a claim of `spec` may find an entry: its key joined a record, or a record of
    /// its fingerprint is undelivered. False without a lock while the filter is empty.
    pub fn may_hold(&self, spec: &ClaimSpec) -> bool {
        if self.blind.load(Ordering::Relaxed) {
            return true;
        }
        if self.is_empty() {
            return false;
        }
        let joined = spec.scope.claim_hash(&spec.key);
        let undelivered = undelivered_hash(&spec.scope, &spec.fingerprint);
        let map = self.map.lock().expect("churn filter lock");
        [joined, undelivered].iter().any(|h| map.contains_key(h))
    }

    /// Waits (a while at most) until no entry a claim of `spec` may find is still being
    /// written by this instance: a retry that comes right after its original's caller went
    /// away finds the entry that says so.
    pub async fn settled(&self, spec: &ClaimSpec) {
        let hashes = [
            spec.scope.claim_hash(&spec.key),
            undelivered_hash(&spec.scope, &spec.fingerprint),
        ];
        let wait = async {
            loop {
                let notified = self.settled.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let pending = {
                    let map = self.map.lock().expect("churn filter lock");
                    hashes.iter().any(|h| map.get(h).is_some_and(|k| k.pending))
                };
                if !pending {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(PENDING_WAIT, wait).await;
    }

    /// Expects an entry this instance is about to write ([`ChurnFilter::written`] once it
    /// is, or is not). A placeholder (an empty record id: a claim still on its way whose
    /// caller left) never hides an entry already known of `hash`: a retry that gave up
    /// while it waited to join a record must not make that record forgotten.
    pub fn expect(&self, hash: [u8; 16], record: RecordId, kind: ChurnKind, until: Timestamp) {
        let mut map = self.map.lock().expect("churn filter lock");
        if record == placeholder() && map.contains_key(&hash) {
            return;
        }
        map.insert(
            hash,
            Known {
                record,
                kind,
                until,
                pending: true,
            },
        );
        self.len.store(map.len(), Ordering::Relaxed);
    }

    /// The entry of `hash` this instance expected for `record` was written (`true`), or
    /// could not be (or, for a placeholder, was not needed); an entry of another record
    /// under that hash is left as it is.
    pub fn written(&self, hash: &[u8; 16], record: &RecordId, ok: bool) {
        {
            let mut map = self.map.lock().expect("churn filter lock");
            let ours = |k: &Known| k.pending && k.record == *record;
            if ok {
                if let Some(k) = map.get_mut(hash).filter(|k| ours(k)) {
                    k.pending = false;
                }
            } else if map.get(hash).is_some_and(ours) {
                map.remove(hash);
            }
            self.len.store(map.len(), Ordering::Relaxed);
        }
        self.settled.notify_waiters();
    }

    /// Whether the filter knows of no entry (one relaxed load).
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Whether `id` is known undelivered here under its undelivered `hash` (one probe):
    /// what an owner's answer that reached its caller asks.
    pub fn undelivered_as(&self, hash: &[u8; 16], id: &RecordId) -> bool {
        if self.is_empty() {
            return false;
        }
        let map = self.map.lock().expect("churn filter lock");
        map.get(hash)
            .is_some_and(|k| k.record == *id && k.kind == ChurnKind::Undelivered)
    }

    /// Whether `id` is known undelivered here: an answer of it that reaches a caller
    /// must say so ([`Ledger::churn_forget`]).
    pub fn undelivered(&self, id: &RecordId) -> bool {
        if self.is_empty() {
            return false;
        }
        let map = self.map.lock().expect("churn filter lock");
        map.values()
            .any(|k| k.record == *id && k.kind == ChurnKind::Undelivered)
    }

    /// Learns an entry (written here, or told of) at `now`, dropping the ones past their
    /// time. (Those are otherwise kept: an entry past its time costs a claim a lookup, not
    /// its answer, which the ledger's rows decide.)
    pub fn add(
        &self,
        hash: [u8; 16],
        record: RecordId,
        kind: ChurnKind,
        until: Timestamp,
        now: Timestamp,
    ) {
        let mut map = self.map.lock().expect("churn filter lock");
        map.retain(|_, k| k.until > now || k.pending);
        map.insert(
            hash,
            Known {
                record,
                kind,
                until,
                pending: false,
            },
        );
        self.len.store(map.len(), Ordering::Relaxed);
    }

    /// Learns every entry read from the table, replacing what was known, and sees again.
    pub fn reload(&self, entries: impl IntoIterator<Item = ChurnEntry>) {
        let mut map = self.map.lock().expect("churn filter lock");
        map.retain(|_, k| k.pending);
        for e in entries {
            let known = Known {
                record: e.record,
                kind: e.kind,
                until: e.until,
                pending: false,
            };
            map.insert(e.hash, known);
        }
        self.len.store(map.len(), Ordering::Relaxed);
        self.blind.store(false, Ordering::Relaxed);
    }

    /// Forgets that `id` is undelivered.
    pub fn delivered(&self, id: &RecordId) {
        let mut map = self.map.lock().expect("churn filter lock");
        map.retain(|_, k| !(k.record == *id && k.kind == ChurnKind::Undelivered));
        self.len.store(map.len(), Ordering::Relaxed);
    }

    /// Stops trusting what it knows until the next [`ChurnFilter::reload`].
    pub fn blind(&self) {
        self.blind.store(true, Ordering::Relaxed);
    }
}

/// What a made-up key that names `record` (the original it joins now, or joined before)
/// claims: the record, as a repeat of the original's key would find it. A released record
/// (its attempt failed and nobody heard of it) is claimed again under the original's key,
/// so it runs again as that key's retry would: the same record, the same downstream key.
async fn of_original<L: Ledger + ?Sized>(
    store: &L,
    spec: &ClaimSpec,
    record: Record,
) -> Result<Claim> {
    if record.state != State::Released {
        return Ok(Claim::Existing(record));
    }
    let mut again = spec.clone();
    again.identity.key = record.key.clone();
    store.claim(&again).await
}

/// Claims `spec` (a client key on a route that recognises made-up keys) on `store`: as
/// [`Ledger::claim`] when the store's filter knows no entry for it; otherwise the key's own
/// record first, then the record it joined before, then an undelivered record of its
/// fingerprint made under another key within the window, which it joins now. Answers the
/// claim, and whether the key joined a record now (it is counted once, then).
///
/// `gone` says whether the claim's caller went away: one that waited for another call's
/// claim to land (a store that stalls) and whose caller left meanwhile claims nothing
/// (`StoreError::Unavailable`): nothing was sent, and nobody waits for it.
pub async fn claim<L: Ledger + ?Sized>(
    store: &L,
    spec: &ClaimSpec,
    churn: Churn,
    gone: &(dyn Fn() -> bool + Send + Sync),
) -> Result<(Claim, bool)> {
    let Some(filter) = store.churn_filter() else {
        return Ok((store.claim(spec).await?, false));
    };
    if !filter.may_hold(spec) {
        return Ok((store.claim(spec).await?, false));
    }
    filter.settled(spec).await;
    if gone() {
        return Err(crate::StoreError::Unavailable(
            "the caller went away before its claim was sent; nothing was claimed".into(),
        ));
    }
    let now = store.now().await?;
    // The key's own record comes first: it was claimed before anything joined under it.
    if store.lookup(&spec.scope, &spec.key).await?.is_some() {
        return Ok((store.claim(spec).await?, false));
    }
    let joined = spec.scope.claim_hash(&spec.key);
    if let Some(entry) = store.churn_get(&joined).await? {
        if let Some(record) = store.get(&entry.record).await? {
            if !record.is_expired(now) {
                return Ok((of_original(store, spec, record).await?, false));
            }
        }
    }
    let hash = undelivered_hash(&spec.scope, &spec.fingerprint);
    let Some(entry) = store.churn_get(&hash).await? else {
        tracing::debug!(key = %spec.key, "no undelivered record of this fingerprint");
        return Ok((store.claim(spec).await?, false));
    };
    let original = match store.get(&entry.record).await? {
        Some(r)
            if entry.until > now
                && !r.is_expired(now)
                && r.key != spec.key
                && r.scope == spec.scope
                && r.fingerprint == spec.fingerprint
                && now.0 - r.created_at.0 <= churn.window.as_millis() as i64 =>
        {
            r
        }
        other => {
            tracing::debug!(key = %spec.key, record = %entry.record,
                state = ?other.map(|r| r.state), "an undelivered record that is not joined");
            return Ok((store.claim(spec).await?, false));
        }
    };
    let entry = ChurnEntry {
        hash: joined,
        record: original.id.clone(),
        kind: ChurnKind::Joined,
        key: Some(spec.key.clone()),
        at: now,
        until: now.plus(churn.keep.max(churn.window)),
    };
    // Two requests under one made-up key at once: the second finds the first's entry.
    let first = store.churn_put(&entry).await?;
    if !first {
        if let Some(e) = store.churn_get(&joined).await? {
            if e.record != original.id {
                if let Some(r) = store.get(&e.record).await? {
                    return Ok((of_original(store, spec, r).await?, false));
                }
            }
        }
    }
    Ok((of_original(store, spec, original).await?, first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::{Class, Identity};

    fn spec(key: &str) -> ClaimSpec {
        ClaimSpec {
            identity: Identity::new(
                "p".into(),
                "POST /x".into(),
                Class::Write,
                Some(key.into()),
                Fingerprint([7; 32]),
                None,
            ),
            owner: "o".into(),
            lease: Duration::from_secs(30),
        }
    }

    #[test]
    fn an_empty_filter_holds_nothing_and_a_blind_one_everything() {
        let f = ChurnFilter::default();
        assert!(!f.may_hold(&spec("a")));
        f.blind();
        assert!(f.may_hold(&spec("a")));
        f.reload([]);
        assert!(!f.may_hold(&spec("a")));
    }

    #[test]
    fn a_placeholder_never_hides_an_entry_already_known() {
        let f = ChurnFilter::default();
        let s = spec("a");
        let hash = undelivered_hash(&s.scope, &s.fingerprint);
        let id = RecordId("rec_1".into());
        let none = placeholder();
        f.expect(hash, id.clone(), ChurnKind::Undelivered, Timestamp(100));
        f.written(&hash, &id, true);
        // A retry that waited to join it, and whose caller left while its claim was on
        // its way: its placeholder, then its claim that owned nothing.
        f.expect(hash, none.clone(), ChurnKind::Undelivered, Timestamp(100));
        f.written(&hash, &none, false);
        assert!(f.undelivered(&id), "the record is still known undelivered");
        assert!(f.may_hold(&spec("b")));
        // A placeholder alone goes once its claim owned nothing.
        let g = ChurnFilter::default();
        g.expect(hash, none.clone(), ChurnKind::Undelivered, Timestamp(100));
        assert!(g.may_hold(&spec("b")));
        g.written(&hash, &none, false);
        assert!(!g.may_hold(&spec("b")));
    }

    #[test]
    fn the_filter_holds_a_fingerprint_until_its_time() {
        let f = ChurnFilter::default();
        let s = spec("a");
        let id = RecordId("rec_1".into());
        f.add(
            undelivered_hash(&s.scope, &s.fingerprint),
            id.clone(),
            ChurnKind::Undelivered,
            Timestamp(100),
            Timestamp(0),
        );
        assert!(f.may_hold(&spec("b")));
        assert!(f.undelivered(&id));
        f.add(
            [1; 16],
            id.clone(),
            ChurnKind::Joined,
            Timestamp(300),
            Timestamp(200),
        );
        assert!(
            !f.undelivered(&id),
            "the undelivered entry was past its time"
        );
        f.delivered(&id);
        assert!(!f.may_hold(&spec("b")));
    }
}
