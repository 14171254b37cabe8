//! The PostgreSQL store's [`Ledger`].
//!
//! - A claim is one plain `INSERT ... ON CONFLICT (claim) DO NOTHING` (`claim`: the key's
//!   16-byte `Scope::claim_hash`), grouped with the instance's concurrent claims
//!   (`batch`); a key already held costs a read of the row holding it (by its claim hash,
//!   refused unless it holds the same scope and key); only a released row (reclaim) or
//!   an expired one (renew) costs a conditional `UPDATE`, so two claimants can never
//!   both win. A claim that meets a completed record is answered from the replay cache
//!   until shortly before it expires.
//! - Owner transitions (`complete`, `release`, `mark_unknown`, `renew`) are one `UPDATE`
//!   fenced by `owner`, `attempt` and `state`; when it matches no row, the row is read and
//!   the pure transition of `oncely_core::record` names the exact refusal.
//! - Rare transitions (`take_over`, `resolve`) lock the row (`SELECT ... FOR UPDATE`),
//!   apply the pure transition, and write the row back, in one transaction.

use std::time::Duration;

use async_trait::async_trait;
use oncely_core::record::{decide_claim, ClaimDecision};
use oncely_core::{
    ClaimSpec, Completion, Fence, Record, RecordId, Resolution, Scope, State, TakeOverOutcome,
    Timestamp, TransitionError,
};
use tokio_postgres::types::ToSql;

use super::batch::{Claimed, Completed};
use super::error::{corrupt, unavailable};
use super::rows::{attempt_param, holding, millis, record_from_row, ResponseColumns};
use super::sql::SQL;
use super::store::PgStore;
use crate::replays::Now;
use crate::watch;
use crate::{new_record_id, ChurnEntry, ChurnFilter, Claim, Ledger, Repeat, Result, StoreError};

impl PgStore {
    /// Explains why a fenced `UPDATE` matched no row: the record is gone, or the pure
    /// transition refuses it. A record that already shows this fence's own transition
    /// (`done`: the state it leaves; `Record::applied`) is that transition retried after
    /// its answer was lost, and is answered as written once the ledger has it durably
    /// ([`PgStore::durable`]).
    async fn refusal(
        &self,
        id: &RecordId,
        fence: &Fence,
        done: Option<State>,
        check: impl FnOnce(&mut Record, Timestamp) -> Result<(), TransitionError>,
    ) -> Result<Record> {
        let mut record = match self.get(id).await? {
            None => return Err(StoreError::NotFound(id.clone())),
            Some(record) => record,
        };
        if done.is_some_and(|state| record.applied(fence, state)) {
            self.durable().await?;
            return Ok(record);
        }
        let now = record.updated_at;
        Err(match check(&mut record, now) {
            Err(e) => StoreError::Transition(e),
            // The fenced UPDATE and the read disagree: only possible if the row changed
            // in between in a way no transition allows.
            Ok(()) => StoreError::Unavailable(format!(
                "record {id} changed while it was written; try again"
            )),
        })
    }

    /// A fenced owner transition: the `UPDATE` in `sql` takes `$1` offset, `$2` id,
    /// `$3` owner, `$4` attempt, then `extra`.
    async fn fenced(
        &self,
        sql: &str,
        fence: &Fence,
        done: Option<State>,
        extra: &[&(dyn ToSql + Sync)],
        check: impl FnOnce(&mut Record, Timestamp) -> Result<(), TransitionError>,
    ) -> Result<Record> {
        let offset = self.offset();
        let attempt = attempt_param(fence.attempt);
        let mut params: Vec<&(dyn ToSql + Sync)> =
            vec![&offset, &fence.id.0, &fence.owner, &attempt];
        params.extend_from_slice(extra);
        match self.query_opt(sql, &params).await? {
            Some(row) => {
                let record = record_from_row(&row)?;
                // Wake local waiters at once, without the round trip through NOTIFY.
                self.inner.waiters.wake(&record.id);
                Ok(record)
            }
            None => self.refusal(&fence.id, fence, done, check).await,
        }
    }

    /// A record claimed here: its lease's watch starts now (`crate::watch`).
    pub(super) fn owned(&self, record: Record) -> Claim {
        watch::record_remaining(&record, self.monotonic());
        Claim::Owned(record)
    }

    /// Completes one record with its own statement.
    async fn complete_alone(&self, fence: &Fence, completion: Completion) -> Result<Record> {
        let response = ResponseColumns::of(Some(&completion.response))?;
        let window = millis(completion.window);
        let until = completion.replay_until.map(|t| t.0);
        let units = completion.units as i64;
        let check_completion = completion.clone();
        self.fenced(
            &SQL.complete,
            fence,
            Some(State::Completed),
            &[
                &window,
                &until,
                &response.status,
                &response.headers,
                &response.body,
                &units,
                &completion.provider_request_id,
                &completion.trace,
            ],
            move |r, now| r.complete(fence, check_completion, now),
        )
        .await
    }

    /// Locks a record, applies `f` to it at the database's time, and writes it back.
    async fn locked<T>(
        &self,
        id: &RecordId,
        f: impl FnOnce(&mut Record, Timestamp) -> Result<T, TransitionError>,
    ) -> Result<T> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(unavailable)?;
        let select = tx.prepare_cached(&SQL.lock).await.map_err(unavailable)?;
        let Some(row) = tx
            .query_opt(&select, &[&self.offset(), &id.0])
            .await
            .map_err(unavailable)?
        else {
            return Err(StoreError::NotFound(id.clone()));
        };
        let now = Timestamp(row.try_get("now").map_err(corrupt)?);
        let mut record = record_from_row(&row)?;
        let out = f(&mut record, now)?;
        let write = tx.prepare_cached(&SQL.write).await.map_err(unavailable)?;
        let response = ResponseColumns::of(record.response.as_ref())?;
        let attempt = attempt_param(record.attempt);
        let units = record.units as i64;
        tx.execute(
            &write,
            &[
                &record.id.0,
                &record.state.as_str(),
                &record.owner,
                &attempt,
                &record.lease_until.map(|t| t.0),
                &record.updated_at.0,
                &record.completed_at.map(|t| t.0),
                &record.expires_at.map(|t| t.0),
                &response.status,
                &response.headers,
                &response.body,
                &units,
                &record.provider_request_id,
                &record.last_error,
                &record.trace,
            ],
        )
        .await
        .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        self.inner.waiters.wake(id);
        Ok(out)
    }
}

#[async_trait]
impl Ledger for PgStore {
    async fn claim(&self, spec: &ClaimSpec) -> Result<Claim> {
        let offset = self.offset();
        // A completed record answers from memory until (shortly before) it expires: no
        // transition applies to it, and nothing can take its key before then.
        let replays = &self.inner.replays;
        if let Some(r) = replays.get(&spec.scope, &spec.key, Now::SinceRead { offset }) {
            return Ok(Claim::Existing(r));
        }
        let epoch = replays.epoch();
        let claim = spec.scope.claim_hash(&spec.key);
        let fingerprint = spec.fingerprint.0.as_slice();
        let lease = millis(spec.lease);
        let batcher = &self.inner.batcher;
        let mut step = batcher.claim(new_record_id(), spec, offset).await?;
        // A purge or another claimant can move the row between our statements; each
        // round either decides or sees a newer row, so a few rounds always suffice.
        for _ in 0..8 {
            let (mut record, now) = match step {
                Claimed::Inserted(record) => return Ok(self.owned(record)),
                Claimed::Held(record, now) => (record, Timestamp(now)),
                // The holder committed after the statement's snapshot: read it now.
                Claimed::Retry => match self
                    .query_opt(&SQL.claim_read, &[&offset, &vec![claim.as_slice()]])
                    .await?
                {
                    Some(row) => (
                        holding(record_from_row(&row)?, &spec.scope, &spec.key)?,
                        Timestamp(row.try_get("now").map_err(corrupt)?),
                    ),
                    None => {
                        step = batcher.claim(new_record_id(), spec, offset).await?;
                        continue;
                    }
                },
            };
            let decided = match decide_claim(Some(&record), spec, now) {
                ClaimDecision::Insert | ClaimDecision::Existing => {
                    replays.offer(epoch, &mut record, now, offset);
                    let seen = watch::as_observed(record, now, self.monotonic());
                    return Ok(Claim::Existing(seen));
                }
                ClaimDecision::Reclaim => {
                    self.query_opt(
                        &SQL.reclaim,
                        &[
                            &offset,
                            &record.id.0,
                            &fingerprint,
                            &spec.owner,
                            &lease,
                            &spec.workflow_id,
                        ],
                    )
                    .await?
                }
                ClaimDecision::Renew => {
                    self.query_opt(
                        &SQL.renew_expired,
                        &[
                            &offset,
                            &record.id.0,
                            &new_record_id().0,
                            &fingerprint,
                            &spec.class.as_str(),
                            &spec.route,
                            &spec.principal,
                            &spec.owner,
                            &lease,
                            &spec.workflow_id,
                        ],
                    )
                    .await?
                }
            };
            if let Some(row) = decided {
                return Ok(self.owned(record_from_row(&row)?));
            }
            // Someone else reclaimed, renewed or purged the row first: claim again.
            step = batcher.claim(new_record_id(), spec, offset).await?;
        }
        Err(StoreError::Unavailable(format!(
            "the claim of key {:?} kept racing with other writers; try again",
            spec.key
        )))
    }

    async fn complete(&self, fence: &Fence, completion: Completion) -> Result<Record> {
        let offset = self.offset();
        let grouped = self.inner.batcher.complete(fence, &completion, offset);
        match grouped.await? {
            Completed::Done(record) => {
                // Wake local waiters at once, without the round trip through NOTIFY.
                self.inner.waiters.wake(&record.id);
                watch::forget(record.id.as_str());
                // Not offered to the replay cache: the first claim that reads it does.
                Ok(*record)
            }
            Completed::Refused => {
                let done = self
                    .refusal(&fence.id, fence, Some(State::Completed), |r, now| {
                        r.complete(fence, completion, now)
                    })
                    .await?;
                watch::forget(done.id.as_str());
                Ok(done)
            }
            Completed::Retry => {
                let done = self.complete_alone(fence, completion).await?;
                watch::forget(done.id.as_str());
                Ok(done)
            }
        }
    }

    async fn release(
        &self,
        fence: &Fence,
        error: Option<String>,
        window: Duration,
    ) -> Result<Record> {
        let window_ms = millis(window);
        let released = self
            .fenced(
                &SQL.release,
                fence,
                Some(State::Released),
                &[&error, &window_ms],
                |r, now| r.release(fence, None, window, now),
            )
            .await?;
        watch::forget(released.id.as_str());
        Ok(released)
    }

    async fn mark_unknown(&self, fence: &Fence, error: String) -> Result<Record> {
        let unknown = self
            .fenced(
                &SQL.mark_unknown,
                fence,
                Some(State::OutcomeUnknown),
                &[&error],
                |r, now| r.mark_unknown(fence, String::new(), now),
            )
            .await?;
        watch::forget(unknown.id.as_str());
        Ok(unknown)
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<()> {
        let lease_ms = millis(lease);
        let renewed = self
            .fenced(&SQL.renew, fence, None, &[&lease_ms], |r, now| {
                r.renew(fence, lease, now)
            })
            .await?;
        watch::record_remaining(&renewed, self.monotonic());
        Ok(())
    }

    async fn take_over(
        &self,
        id: &RecordId,
        expected_attempt: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<TakeOverOutcome> {
        // A lease counts as lapsed only once the server has been the primary it is now for
        // a whole lease (`UP`): an owner that could not renew while the database was down,
        // or while a standby was being promoted, is alive, and is given one lease after a
        // restart or a failover to renew before anyone takes its record over.
        let up: i64 = self
            .query_opt(&SQL.up, &[&self.offset()])
            .await?
            .map(|row| row.try_get("up"))
            .transpose()
            .map_err(corrupt)?
            .unwrap_or(i64::MAX);
        if up < millis(lease) {
            return Err(StoreError::Transition(TransitionError::LeaseHeld {
                id: id.clone(),
            }));
        }
        // And only once this process has seen the same lease token for a whole lease
        // (`crate::watch`): a renewal or a claim whose commit waited (a synchronous standby
        // away) is already lapsed by the database's clock when it becomes visible, while
        // its owner is alive and renews again.
        let mono = self.monotonic();
        self.locked(id, |r, now| {
            if r.state == State::Processing
                && r.attempt == expected_attempt
                && !watch::record_remaining(r, mono).is_zero()
            {
                return Err(TransitionError::LeaseHeld { id: r.id.clone() });
            }
            let outcome = r.take_over(expected_attempt, owner, lease, now)?;
            watch::record_remaining(r, mono);
            Ok(outcome)
        })
        .await
    }

    async fn get(&self, id: &RecordId) -> Result<Option<Record>> {
        let Some(row) = self.query_opt(&SQL.get, &[&self.offset(), &id.0]).await? else {
            return Ok(None);
        };
        let now = Timestamp(row.try_get("now").map_err(corrupt)?);
        Ok(Some(watch::as_observed(
            record_from_row(&row)?,
            now,
            self.monotonic(),
        )))
    }

    async fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<Record>> {
        let claim = scope.claim_hash(key);
        self.query_opt(&SQL.lookup, &[&claim.as_slice()])
            .await?
            .map(|row| holding(record_from_row(&row)?, scope, key))
            .transpose()
    }

    async fn resolve(&self, id: &RecordId, resolution: Resolution) -> Result<Record> {
        self.locked(id, |r, now| {
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
        repeats: &[Repeat],
    ) -> Result<()> {
        let count: u64 = repeats.iter().map(|r| r.count).sum();
        let units: u64 = repeats.iter().map(|r| r.units).sum();
        let at: Vec<i64> = repeats.iter().map(|r| r.at.0).collect();
        let kind: Vec<&str> = repeats.iter().map(|r| r.kind.as_str()).collect();
        let each: Vec<i64> = repeats.iter().map(|r| r.units as i64).collect();
        let counts: Vec<i64> = repeats.iter().map(|r| r.count as i64).collect();
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&SQL.record_repeats)
            .await
            .map_err(unavailable)?;
        // One statement: the counters and the events are written together or not at all.
        client
            .execute(
                &stmt,
                &[
                    &id.0,
                    &(count as i64),
                    &(units as i64),
                    &at,
                    &kind,
                    &each,
                    &principal,
                    &route,
                    &counts,
                ],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn now(&self) -> Result<Timestamp> {
        let row = self
            .query_opt(&SQL.now, &[&self.offset()])
            .await?
            .ok_or_else(|| StoreError::Unavailable("the database returned no time".into()))?;
        Ok(Timestamp(row.try_get(0).map_err(corrupt)?))
    }

    fn churn_filter(&self) -> Option<&ChurnFilter> {
        Some(&self.inner.churn)
    }

    async fn churn_get(&self, hash: &[u8; 16]) -> Result<Option<ChurnEntry>> {
        self.churn_entry(hash).await
    }

    async fn churn_put(&self, entry: &ChurnEntry) -> Result<bool> {
        self.churn_insert(entry).await
    }

    async fn churn_forget(&self, id: &RecordId) -> Result<()> {
        self.churn_delete_undelivered(id).await
    }

    async fn churn_of(&self, id: &RecordId) -> Result<Vec<ChurnEntry>> {
        self.churn_entries(id).await
    }

    async fn ping(&self) -> Result<()> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await.map_err(unavailable)?;
        Ok(())
    }
}
