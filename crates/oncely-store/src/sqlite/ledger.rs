//! The SQLite store's [`Ledger`]: a claim and every transition run in the writer, as
//! the pure rules of `oncely_core::record`; a lookup or a claim that meets a replayable
//! record is answered from the replay cache.

use std::time::Duration;

use async_trait::async_trait;
use oncely_core::{
    ClaimSpec, Completion, Fence, Record, RecordId, Resolution, Scope, State, TakeOverOutcome,
    Timestamp, TransitionError,
};
use rusqlite::Connection;

use super::churn::ChurnTable;
use super::error::sql_error;
use super::writer::Applied;
use super::{repeats, rows, usage, SqliteStore};
use crate::plan::plan_claims;
use crate::replays::{Now, ReplayCache};
use crate::watch;
use crate::{new_record_id, ChurnEntry, ChurnFilter, Claim, Ledger, Repeat, Result, StoreError};

impl SqliteStore {
    /// Offers a record read since `epoch` to the replay cache.
    fn offer(&self, epoch: u64, record: &mut Record) {
        let offset = self.clock.offset().as_millis().min(i64::MAX as u128) as i64;
        self.cache.offer(epoch, record, self.clock.now(), offset);
    }

    /// Applies a fenced or guarded transition to one record inside the writer.
    async fn transition<T, F>(&self, id: &RecordId, change: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Record, Timestamp) -> Result<T, TransitionError> + Send + 'static,
    {
        let id = id.clone();
        self.writer
            .run(move |conn, now| mutate(conn, &id, now, change))
            .await
    }
}

/// Reads a record, applies `change` to a copy, and writes it back only if allowed.
fn mutate<T>(
    conn: &Connection,
    id: &RecordId,
    now: Timestamp,
    change: impl FnOnce(&mut Record, Timestamp) -> Result<T, TransitionError>,
) -> Result<Applied<T>> {
    let mut record = rows::by_id(conn, id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
    let out = change(&mut record, now)?;
    rows::update_state(conn, &record)?;
    Ok((out, Some(id.clone())))
}

/// The atomic claim: the row holding `(scope, key)` decides, inside the writer. A lease
/// met or made here is watched on the monotonic clock `mono` ([`watch`]).
fn claim_in(
    conn: &Connection,
    spec: &ClaimSpec,
    now: Timestamp,
    mono: Duration,
    cache: &ReplayCache,
) -> Result<Applied<Claim>> {
    // Most claims are of a new key: try the insert first (what the plan says for no
    // row), and read the row only when one already holds the key. The single writer
    // (and `BEGIN IMMEDIATE` between processes) keeps the two steps one decision.
    let record = Record::new_claim(new_record_id(), spec, now);
    if rows::insert_new(conn, &record)? {
        watch::record_remaining(&record, mono);
        return Ok((Claim::Owned(record), None));
    }
    let Some(mut existing) = rows::by_key_sharing(conn, &spec.scope, &spec.key, cache)? else {
        return Err(StoreError::Unavailable(
            "the insert of a claim met a row that is gone".into(),
        ));
    };
    // A large answer is read only when no replay holds it, and what is read is shared
    // with the replays before the next claim: its replays hold one copy and cost one read.
    cache.share(&mut existing, now);
    let plan = plan_claims(std::slice::from_ref(spec), None, now, |_, _| {
        Ok(Some(existing.clone()))
    })?;
    let claim = match plan {
        Err(record) => Claim::Existing(watch::as_observed(record, now, mono)),
        Ok(mut records) => {
            let (replaces, record) = records.pop().expect("a granted plan has a record");
            match replaces {
                // Reclaimed: the same row, attempt + 1.
                Some(old) if old == record.id => rows::update_state(conn, &record)?,
                // Renewed: a new intention under the key, with a new id and identity; the
                // expired one leaves the ledger, its count stays.
                Some(old) => {
                    usage::fold_record(conn, &old.0)?;
                    rows::replace(conn, &old, &record)?
                }
                None => {
                    return Err(StoreError::Unavailable(
                        "a claim planned an insert over a row".into(),
                    ))
                }
            }
            Claim::Owned(record)
        }
    };
    if let Claim::Owned(record) = &claim {
        watch::record_remaining(record, mono);
    }
    Ok((claim, None))
}

#[async_trait]
impl Ledger for SqliteStore {
    async fn claim(&self, spec: &ClaimSpec) -> Result<Claim> {
        // A replayable record answers at once: nothing can take its key before it expires.
        if let Some(r) = self
            .cache
            .get(&spec.scope, &spec.key, Now::Is(self.clock.now()))
        {
            return Ok(Claim::Existing(r));
        }
        let epoch = self.cache.epoch();
        let spec = spec.clone();
        let clock = self.clock.clone();
        let cache = self.cache.clone();
        let mut claim = self
            .writer
            .run(move |conn, now| claim_in(conn, &spec, now, clock.monotonic(), &cache))
            .await?;
        if let Claim::Existing(r) = &mut claim {
            self.offer(epoch, r);
        }
        Ok(claim)
    }

    async fn complete(&self, fence: &Fence, completion: Completion) -> Result<Record> {
        let fence = fence.clone();
        let done = self
            .transition(&fence.id.clone(), move |r, now| {
                r.complete(&fence, completion, now)?;
                Ok(r.clone())
            })
            .await?;
        watch::forget(done.id.as_str());
        // Not offered to the replay cache: the first claim or lookup that reads it does.
        Ok(done)
    }

    async fn release(
        &self,
        fence: &Fence,
        error: Option<String>,
        window: Duration,
    ) -> Result<Record> {
        let fence = fence.clone();
        let done = self
            .transition(&fence.id.clone(), move |r, now| {
                r.release(&fence, error, window, now)?;
                Ok(r.clone())
            })
            .await?;
        watch::forget(done.id.as_str());
        Ok(done)
    }

    async fn mark_unknown(&self, fence: &Fence, error: String) -> Result<Record> {
        let fence = fence.clone();
        let done = self
            .transition(&fence.id.clone(), move |r, now| {
                r.mark_unknown(&fence, error, now)?;
                Ok(r.clone())
            })
            .await?;
        watch::forget(done.id.as_str());
        Ok(done)
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<()> {
        let fence = fence.clone();
        let clock = self.clock.clone();
        self.transition(&fence.id.clone(), move |r, now| {
            r.renew(&fence, lease, now)?;
            watch::record_remaining(r, clock.monotonic());
            Ok(())
        })
        .await
    }

    async fn take_over(
        &self,
        id: &RecordId,
        expected_attempt: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<TakeOverOutcome> {
        let owner = owner.to_string();
        let clock = self.clock.clone();
        self.transition(id, move |r, now| {
            // Lapsed or not is decided on the monotonic clock, not by `now` ([`watch`]).
            if r.state == State::Processing && r.attempt == expected_attempt {
                if !watch::record_remaining(r, clock.monotonic()).is_zero() {
                    return Err(TransitionError::LeaseHeld { id: r.id.clone() });
                }
                r.lease_until = Some(now);
            }
            let outcome = r.take_over(expected_attempt, &owner, lease, now)?;
            watch::record_remaining(r, clock.monotonic());
            Ok(outcome)
        })
        .await
    }

    async fn get(&self, id: &RecordId) -> Result<Option<Record>> {
        let id = id.clone();
        let found = self.read(move |conn| rows::by_id(conn, &id)).await?;
        let (now, mono) = (self.clock.now(), self.clock.monotonic());
        Ok(found.map(|r| watch::as_observed(r, now, mono)))
    }

    async fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<Record>> {
        if let Some(r) = self.cache.get(scope, key, Now::Is(self.clock.now())) {
            return Ok(Some(r));
        }
        let epoch = self.cache.epoch();
        let (scope, key) = (scope.clone(), key.to_string());
        let mut found = self
            .read(move |conn| rows::by_key(conn, &scope, &key))
            .await?;
        if let Some(r) = &mut found {
            self.offer(epoch, r);
        }
        Ok(found)
    }

    async fn resolve(&self, id: &RecordId, resolution: Resolution) -> Result<Record> {
        self.transition(id, move |r, now| {
            r.resolve(resolution, now)?;
            Ok(r.clone())
        })
        .await
    }

    async fn record_repeats(
        &self,
        id: &RecordId,
        principal: &str,
        route: &str,
        events: &[Repeat],
    ) -> Result<()> {
        let changed = id.clone();
        let id = id.clone();
        let (principal, route) = (principal.to_owned(), route.to_owned());
        let events = events.to_vec();
        let out = self
            .writer
            .run(move |conn, _now| {
                repeats::record(conn, &id, &principal, &route, &events)?;
                Ok(((), None))
            })
            .await;
        // After the commit: later lookups read the new counters.
        self.cache.forget(&changed);
        out
    }

    async fn now(&self) -> Result<Timestamp> {
        Ok(self.clock.now())
    }

    fn churn_filter(&self) -> Option<&ChurnFilter> {
        Some(&self.churn)
    }

    async fn churn_get(&self, hash: &[u8; 16]) -> Result<Option<ChurnEntry>> {
        self.get_entry(hash).await
    }

    async fn churn_put(&self, entry: &ChurnEntry) -> Result<bool> {
        self.put_entry(entry).await
    }

    async fn churn_forget(&self, id: &RecordId) -> Result<()> {
        self.forget_undelivered(id).await
    }

    async fn churn_of(&self, id: &RecordId) -> Result<Vec<ChurnEntry>> {
        self.entries_of(id).await
    }

    async fn ping(&self) -> Result<()> {
        self.read(|conn| {
            conn.query_row("SELECT 1", [], |_| Ok(()))
                .map_err(sql_error)
        })
        .await?;
        // The writer too: a ledger that can be read but not written is not healthy.
        self.writer.run(|_, _| Ok(((), None))).await
    }
}
