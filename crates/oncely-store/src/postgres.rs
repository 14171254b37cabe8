//! The PostgreSQL store: several gateway instances share one ledger.
//!
//! - A claim is one `INSERT ... ON CONFLICT (scope, key) DO NOTHING` that also returns the
//!   row already holding the key; only a released row (reclaim) or an expired one (renew)
//!   costs a second, conditional `UPDATE`, so two claimants can never both win.
//! - Concurrent claims, and concurrent completions, of one instance are grouped into one
//!   statement and one commit each (`postgres/batch.rs`); a lone call runs its own
//!   statement at once.
//! - Owner transitions (`complete`, `release`, `mark_unknown`, `renew`) are one `UPDATE`
//!   fenced by `owner`, `attempt` and `state`; when it matches no row, the row is read and
//!   the pure transition of `oncely_core::record` names the exact refusal.
//! - Rare transitions (`take_over`, `resolve`) lock the row (`SELECT ... FOR UPDATE`),
//!   apply the pure transition, and write the row back, in one transaction.
//! - A claim that meets a completed record is answered from an in-memory cache of
//!   completed records until shortly before the record expires (`crate::replays`):
//!   a completed record is final, so every instance may replay it without a round trip.
//! - Every time comes from the database's clock (`clock_timestamp()`), plus the offset of
//!   the store's [`Clock`] (zero outside tests), so that instances with
//!   skewed clocks agree on leases and windows.
//! - `wait_for` counts itself in the row's `waiting` column; a transition out of
//!   `processing` sends `NOTIFY` only when that count is above zero, and the
//!   listener (`postgres/listener.rs`) of every instance wakes its local waiters.
//! - Schema changes are the versioned [`migrations`], applied by [`PgStore::connect`].
//!
//! Connections are plain TCP (no TLS): run PostgreSQL on a private network or through a
//! local proxy.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use oncely_core::record::{decide_claim, ClaimDecision};
use oncely_core::{
    ClaimSpec, Completion, Fence, Fingerprint, Record, RecordId, Resolution, Scope, State,
    StoredResponse, TakeOverOutcome, Timestamp, TransitionError,
};
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use self::batch::{Batcher, Completed, Step};
use crate::memory::usage_from_rows;
use crate::replays::{Limits, Now, ReplayCache};
use crate::waiters::Waiters;
use crate::{
    new_record_id, Admin, Claim, Clock, Ledger, ListFilter, ReconcileSchedule, Repeat, RepeatEvent,
    RepeatEvents, RepeatKind, Result, Store, StoreError, StoreOptions, Usage, UsageRow, Waiting,
};

mod batch;
mod listener;
pub mod migrations;
mod queue;
mod reconcile;

/// How long an operation waits for a pooled connection, or for a new one, before the
/// store answers [`StoreError::Unavailable`].
const POOL_TIMEOUT: Duration = Duration::from_secs(3);

/// Opens (and migrates) the PostgreSQL store at `url`.
pub async fn open(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    Ok(Arc::new(PgStore::connect(url, options).await?))
}

/// The PostgreSQL store. Clones share the pool, the listener and the waiters.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    waiters: Arc<Waiters>,
    clock: Arc<dyn Clock>,
    listener: JoinHandle<()>,
    batcher: Batcher,
    /// Completed records, served to `claim` (see `crate::replays`): a claim that finds a
    /// completed record is answered from memory, on any instance sharing the database,
    /// for as long as the record is replayable. It stays honest this way:
    ///
    /// - it answers only [`Ledger::claim`] (not `get`, `lookup` or `list`, which show the
    ///   repeat counters, which a claim answered from a completed record does not read),
    ///   and only with records that were read completed, i.e. from a durable completion;
    /// - its time is the database's time of an entry's read carried forward on this
    ///   host's monotonic clock ([`Now::SinceRead`]): a step of this host's wall clock
    ///   cannot stretch a record's window;
    /// - within [`REPLAY_LIMITS`]: an entry counts as expired a margin before the record
    ///   does, so that the drift between this host's monotonic clock and the database's
    ///   clock cannot serve a record that another instance already purged, and is read
    ///   again from the database after an age limit at the latest.
    ///
    /// A record enters when a claim reads it completed, not when this instance completes
    /// it.
    replays: ReplayCache,
}

/// The replay cache's limits on PostgreSQL: an entry counts as expired 1 s before its
/// record does, and is read again after a minute at the latest.
const REPLAY_LIMITS: Limits = Limits {
    margin: Duration::from_secs(1),
    max_age: Some(Duration::from_secs(60)),
    ..Limits::DEFAULT
};

impl Drop for Inner {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.inner.pool.status();
        f.debug_struct("PgStore")
            .field("pool_size", &status.max_size)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://USER[:PASS]@HOST[:PORT]/DB[?options=...]`), applies
    /// pending migrations, and starts listening for wake-ups.
    pub async fn connect(url: &str, options: StoreOptions) -> Result<PgStore> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::Config(format!(
                "bad PostgreSQL URL: {}",
                oncely_core::error_chain(&e)
            ))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(POOL_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("oncely");
        }
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .wait_timeout(Some(POOL_TIMEOUT))
            .create_timeout(Some(POOL_TIMEOUT))
            .recycle_timeout(Some(POOL_TIMEOUT))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(format!("PostgreSQL pool: {e}")))?;
        {
            let mut client = pool.get().await.map_err(pool_error)?;
            migrations::migrate(&mut client).await?;
        }
        let waiters = Arc::new(Waiters::default());
        let listener = listener::start(config, waiters.clone()).await?;
        // Fewer statements in flight than connections make bigger groups: measured best
        // at a quarter of the pool (16 connections: 4 claim statements at a time).
        let batcher = Batcher::start(pool.clone(), (options.pool_size / 4).max(1));
        Ok(PgStore {
            inner: Arc::new(Inner {
                batcher,
                replays: ReplayCache::new(REPLAY_LIMITS),
                pool,
                waiters,
                clock: options.clock,
                listener,
            }),
        })
    }

    /// The connection pool, for other tables on the same database (job and delivery
    /// queues); their schema belongs in [`migrations::MIGRATIONS`].
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The clock's offset from system time, in milliseconds: added to the database's
    /// clock in every statement that reads or writes a time.
    fn offset(&self) -> i64 {
        self.inner.clock.offset().as_millis().min(i64::MAX as u128) as i64
    }

    async fn client(&self) -> Result<Object> {
        self.inner.pool.get().await.map_err(pool_error)
    }

    /// Runs one cached statement and returns its rows.
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.map_err(unavailable)?;
        client.query(&stmt, params).await.map_err(unavailable)
    }

    async fn query_opt(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.map_err(unavailable)?;
        client.query_opt(&stmt, params).await.map_err(unavailable)
    }

    /// Explains why a fenced `UPDATE` matched no row: the record is gone, or the pure
    /// transition refuses it.
    async fn refusal(
        &self,
        id: &RecordId,
        check: impl FnOnce(&mut Record, Timestamp) -> Result<(), TransitionError>,
    ) -> StoreError {
        match self.get(id).await {
            Err(e) => e,
            Ok(None) => StoreError::NotFound(id.clone()),
            Ok(Some(mut record)) => {
                let now = record.updated_at;
                match check(&mut record, now) {
                    Err(e) => StoreError::Transition(e),
                    // The fenced UPDATE and the read disagree: only possible if the row
                    // changed in between in a way no transition allows.
                    Ok(()) => StoreError::Unavailable(format!(
                        "record {id} changed while it was written; try again"
                    )),
                }
            }
        }
    }

    /// A fenced owner transition: the `UPDATE` in `sql` takes `$1` offset, `$2` id,
    /// `$3` owner, `$4` attempt, then `extra`.
    async fn fenced(
        &self,
        sql: &str,
        fence: &Fence,
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
            None => Err(self.refusal(&fence.id, check).await),
        }
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
            &[
                &window,
                &until,
                &response.status,
                &response.headers,
                &response.body,
                &units,
                &completion.provider_request_id,
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
            ],
        )
        .await
        .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        self.inner.waiters.wake(id);
        Ok(out)
    }

    /// Counts a waiter in the row if it is processing, and returns the row either way.
    async fn start_waiting(&self, id: &RecordId) -> Result<(Option<Record>, bool)> {
        if let Some(row) = self.query_opt(&SQL.wait_start, &[&id.0]).await? {
            return Ok((Some(record_from_row(&row)?), true));
        }
        Ok((self.get(id).await?, false))
    }
}

/// Uncounts a waiter when its `wait_for` ends, however it ends.
struct WaitingGuard {
    pool: Pool,
    id: RecordId,
}

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        let pool = self.pool.clone();
        let id = std::mem::take(&mut self.id.0);
        // A lost decrement only costs extra NOTIFYs for this record, never a missed wake.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Ok(client) = pool.get().await {
                    if let Ok(stmt) = client.prepare_cached(&SQL.wait_end).await {
                        let _ = client.execute(&stmt, &[&id]).await;
                    }
                }
            });
        }
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
        let fingerprint = spec.fingerprint.0.as_slice();
        let lease = millis(spec.lease);
        let batcher = &self.inner.batcher;
        let mut step = batcher.claim(new_record_id(), spec, offset).await?;
        // A purge or another claimant can move the row between our statements; each
        // round either decides or sees a newer row, so a few rounds always suffice.
        for _ in 0..8 {
            let (record, now) = match step {
                Step::Inserted(record) => return Ok(Claim::Owned(record)),
                Step::Held(record, now) => (record, Timestamp(now)),
                // The holder committed after the statement's snapshot: read it now.
                Step::Retry => match self
                    .query_opt(&SQL.claim_read, &[&offset, &spec.scope.as_str(), &spec.key])
                    .await?
                {
                    Some(row) => (
                        record_from_row(&row)?,
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
                    replays.offer(epoch, &record, now, offset);
                    return Ok(Claim::Existing(record));
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
                return Ok(Claim::Owned(record_from_row(&row)?));
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
                // Not offered to the replay cache: the first claim that reads it does.
                Ok(*record)
            }
            Completed::Refused => Err(self
                .refusal(&fence.id, |r, now| r.complete(fence, completion, now))
                .await),
            Completed::Retry => self.complete_alone(fence, completion).await,
        }
    }

    async fn release(
        &self,
        fence: &Fence,
        error: Option<String>,
        window: Duration,
    ) -> Result<Record> {
        let window_ms = millis(window);
        self.fenced(&SQL.release, fence, &[&error, &window_ms], |r, now| {
            r.release(fence, None, window, now)
        })
        .await
    }

    async fn mark_unknown(&self, fence: &Fence, error: String) -> Result<Record> {
        self.fenced(&SQL.mark_unknown, fence, &[&error], |r, now| {
            r.mark_unknown(fence, String::new(), now)
        })
        .await
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<()> {
        let lease_ms = millis(lease);
        self.fenced(&SQL.renew, fence, &[&lease_ms], |r, now| {
            r.renew(fence, lease, now)
        })
        .await
        .map(|_| ())
    }

    async fn take_over(
        &self,
        id: &RecordId,
        expected_attempt: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<TakeOverOutcome> {
        // A lease counts as lapsed only once the server has been up for a whole lease: an
        // owner that could not renew while the database was down is alive, and is given
        // one lease after a restart to renew before anyone takes its record over.
        let up: i64 = self
            .query_opt(NOW, &[&self.offset()])
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
        self.locked(id, |r, now| {
            r.take_over(expected_attempt, owner, lease, now)
        })
        .await
    }

    async fn get(&self, id: &RecordId) -> Result<Option<Record>> {
        self.query_opt(&SQL.get, &[&id.0])
            .await?
            .map(|row| record_from_row(&row))
            .transpose()
    }

    async fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<Record>> {
        self.query_opt(&SQL.lookup, &[&scope.as_str(), &key])
            .await?
            .map(|row| record_from_row(&row))
            .transpose()
    }

    async fn resolve(&self, id: &RecordId, resolution: Resolution) -> Result<Record> {
        self.locked(id, |r, now| {
            r.resolve(resolution, now)?;
            Ok(r.clone())
        })
        .await
    }

    async fn add_repeats(&self, id: &RecordId, count: u64, units: u64) -> Result<()> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&SQL.add_repeats)
            .await
            .map_err(unavailable)?;
        let n = client
            .execute(&stmt, &[&id.0, &(count as i64), &(units as i64)])
            .await
            .map_err(unavailable)?;
        if n == 0 {
            return Err(StoreError::NotFound(id.clone()));
        }
        Ok(())
    }

    async fn record_repeats(&self, id: &RecordId, repeats: &[Repeat]) -> Result<()> {
        if repeats.is_empty() {
            return self.add_repeats(id, 0, 0).await;
        }
        let units: u64 = repeats.iter().map(|r| r.units).sum();
        let at: Vec<i64> = repeats.iter().map(|r| r.at.0).collect();
        let kind: Vec<&str> = repeats.iter().map(|r| r.kind.as_str()).collect();
        let each: Vec<i64> = repeats.iter().map(|r| r.units as i64).collect();
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&SQL.record_repeats)
            .await
            .map_err(unavailable)?;
        // One statement: the counters and the events are written together or not at all.
        let n = client
            .execute(
                &stmt,
                &[
                    &id.0,
                    &(repeats.len() as i64),
                    &(units as i64),
                    &at,
                    &kind,
                    &each,
                ],
            )
            .await
            .map_err(unavailable)?;
        if n == 0 {
            return Err(StoreError::NotFound(id.clone()));
        }
        Ok(())
    }

    async fn now(&self) -> Result<Timestamp> {
        let row = self
            .query_opt(&SQL.now, &[&self.offset()])
            .await?
            .ok_or_else(|| StoreError::Unavailable("the database returned no time".into()))?;
        Ok(Timestamp(row.try_get(0).map_err(corrupt)?))
    }

    async fn ping(&self) -> Result<()> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await.map_err(unavailable)?;
        Ok(())
    }
}

#[async_trait]
impl Waiting for PgStore {
    async fn wait_for(&self, id: &RecordId, timeout: Duration) -> Result<Record> {
        let deadline = tokio::time::Instant::now() + timeout;
        // Subscribe before the first read, so a NOTIFY that arrives in between still wakes.
        let sub = self.inner.waiters.subscribe(id);
        let notified = sub.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (first, counted) = self.start_waiting(id).await?;
        let _guard = counted.then(|| WaitingGuard {
            pool: self.inner.pool.clone(),
            id: id.clone(),
        });
        let mut record = first.ok_or_else(|| StoreError::NotFound(id.clone()))?;
        loop {
            if record.state != State::Processing {
                return Ok(record);
            }
            if tokio::time::timeout_at(deadline, notified.as_mut())
                .await
                .is_err()
            {
                return Ok(record);
            }
            notified.set(sub.notify().notified());
            notified.as_mut().enable();
            record = self
                .get(id)
                .await?
                .ok_or_else(|| StoreError::NotFound(id.clone()))?;
        }
    }
}

#[async_trait]
impl Admin for PgStore {
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let state = filter.state.map(State::as_str);
        let limit = filter.limit.map(|l| l.min(i64::MAX as usize) as i64);
        self.query(
            &SQL.list,
            &[&state, &filter.principal, &filter.route, &limit],
        )
        .await?
        .iter()
        .map(record_from_row)
        .collect()
    }

    async fn purge_expired(&self) -> Result<u64> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&SQL.purge)
            .await
            .map_err(unavailable)?;
        let gone = client
            .execute(&stmt, &[&self.offset()])
            .await
            .map_err(unavailable)?;
        let stmt = client
            .prepare_cached(&SQL.purge_repeats)
            .await
            .map_err(unavailable)?;
        client
            .execute(&stmt, &[&self.offset()])
            .await
            .map_err(unavailable)?;
        Ok(gone)
    }

    async fn repeat_events(
        &self,
        principal: &str,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<RepeatEvents> {
        let since = since.map_or(i64::MIN, |s| s.0);
        let totals = self
            .query_opt(&SQL.repeat_totals, &[&principal, &since])
            .await?
            .ok_or_else(|| StoreError::Unavailable("the database returned no totals".into()))?;
        let total: i64 = totals.try_get(0).map_err(corrupt)?;
        let total_units: i64 = totals.try_get(1).map_err(corrupt)?;
        let limit = limit.min(i64::MAX as usize) as i64;
        let rows = self
            .query(&SQL.repeat_list, &[&principal, &since, &limit])
            .await?;
        let listed = rows
            .iter()
            .map(|row| {
                let kind: String = row.try_get("kind").map_err(corrupt)?;
                Ok(RepeatEvent {
                    record: RecordId(row.try_get("record_id").map_err(corrupt)?),
                    route: row.try_get("route").map_err(corrupt)?,
                    at: Timestamp(row.try_get("at").map_err(corrupt)?),
                    kind: RepeatKind::parse(&kind).ok_or_else(|| {
                        StoreError::Corrupt(format!("unknown repeat kind {kind:?}"))
                    })?,
                    units: row.try_get::<_, i64>("units").map_err(corrupt)? as u64,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RepeatEvents {
            listed,
            total: total as u64,
            total_units: total_units as u64,
        })
    }

    async fn usage(&self, since: Option<Timestamp>) -> Result<Usage> {
        let rows = self.query(&SQL.usage, &[&since.map(|t| t.0)]).await?;
        let rows = rows
            .iter()
            .map(|row| {
                Ok(UsageRow {
                    principal: row.try_get("principal").map_err(corrupt)?,
                    fresh: unsigned(row, "fresh")?,
                    fresh_units: unsigned(row, "fresh_units")?,
                    repeats: unsigned(row, "repeats")?,
                    repeat_units: unsigned(row, "repeat_units")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(usage_from_rows(rows))
    }

    async fn secret(&self, name: &str) -> Result<Vec<u8>> {
        let candidate = rand::random::<[u8; 32]>().to_vec();
        let client = self.client().await?;
        let insert = client
            .prepare_cached(
                "INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            )
            .await
            .map_err(unavailable)?;
        client
            .execute(&insert, &[&name, &candidate])
            .await
            .map_err(unavailable)?;
        let read = client
            .prepare_cached("SELECT value FROM secrets WHERE name = $1")
            .await
            .map_err(unavailable)?;
        let row = client
            .query_one(&read, &[&name])
            .await
            .map_err(unavailable)?;
        row.try_get(0).map_err(corrupt)
    }

    async fn reconcile_schedule(&self, id: &RecordId) -> Result<Option<ReconcileSchedule>> {
        self.reconcile_get(id).await
    }

    async fn schedule_reconcile(
        &self,
        id: &RecordId,
        seen: ReconcileSchedule,
        next: ReconcileSchedule,
    ) -> Result<bool> {
        self.reconcile_set(id, seen, next).await
    }
}

/// The columns of a record, in the order [`record_from_row`] reads them by name.
const COLUMNS: &[&str] = &[
    "id",
    "scope",
    "key",
    "fingerprint",
    "class",
    "route",
    "principal",
    "state",
    "owner",
    "attempt",
    "lease_until",
    "created_at",
    "updated_at",
    "completed_at",
    "expires_at",
    "response_status",
    "response_headers",
    "response_body",
    "units",
    "repeats",
    "repeat_units",
    "workflow_id",
    "provider_request_id",
    "last_error",
    "waiting",
];

/// `prefix.col, prefix.col, ...`
fn cols(prefix: &str) -> String {
    COLUMNS
        .iter()
        .map(|c| format!("{prefix}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The database's time in ms since the epoch, plus the offset in `$1`, and how long the
/// server has been up, in ms, plus the same offset (`up`: a test clock's steps count as
/// time the server was up).
const NOW: &str =
    "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1::bigint AS now, \
     (extract(epoch FROM clock_timestamp() - pg_postmaster_start_time()) * 1000)::bigint + $1::bigint AS up";

/// Every statement the store runs, built once.
struct Statements {
    claim: String,
    claim_read: String,
    reclaim: String,
    renew_expired: String,
    complete: String,
    release: String,
    mark_unknown: String,
    renew: String,
    lock: String,
    write: String,
    get: String,
    lookup: String,
    wait_start: String,
    wait_end: String,
    list: String,
    purge: String,
    add_repeats: String,
    record_repeats: String,
    repeat_totals: String,
    repeat_list: String,
    purge_repeats: String,
    usage: String,
    now: String,
}

/// A fenced owner transition that sets `set` and sends NOTIFY when someone waits.
fn fenced_update(set: &str, notify: bool) -> String {
    let notify = if notify {
        format!(
            ", CASE WHEN u.waiting > 0 THEN pg_notify('{}', u.id) END AS notified",
            listener::CHANNEL
        )
    } else {
        String::new()
    };
    format!(
        "WITH t AS ({NOW}), u AS (
             UPDATE records r SET {set}
             FROM t
             WHERE r.id = $2 AND r.owner = $3 AND r.attempt = $4 AND r.state = 'processing'
             RETURNING {ret})
         SELECT u.*{notify} FROM u",
        ret = cols("r")
    )
}

static SQL: LazyLock<Statements> = LazyLock::new(|| Statements {
    claim: format!(
        "WITH t AS ({NOW}),
         ins AS (
             INSERT INTO records (id, scope, key, fingerprint, class, route, principal, state,
                                  owner, attempt, lease_until, created_at, updated_at,
                                  workflow_id)
             SELECT $2, $3, $4, $5, $6, $7, $8, 'processing', $9, 1, t.now + $10, t.now,
                    t.now, $11
             FROM t
             ON CONFLICT (scope, key) DO NOTHING
             RETURNING {ins})
         SELECT true AS inserted, t.now, {ins} FROM ins, t
         UNION ALL
         SELECT false, t.now, {r} FROM records r, t
         WHERE r.scope = $3 AND r.key = $4 AND NOT EXISTS (SELECT 1 FROM ins)",
        ins = COLUMNS.join(", "),
        r = cols("r"),
    ),
    claim_read: format!(
        "WITH t AS ({NOW})
         SELECT false AS inserted, t.now, {r} FROM records r, t
         WHERE r.scope = $2 AND r.key = $3",
        r = cols("r")
    ),
    reclaim: format!(
        "WITH t AS ({NOW})
         UPDATE records r SET state = 'processing', owner = $4, attempt = r.attempt + 1,
             lease_until = t.now + $5, updated_at = t.now, expires_at = NULL,
             workflow_id = COALESCE($6, r.workflow_id)
         FROM t
         WHERE r.id = $2 AND r.state = 'released' AND r.fingerprint = $3
         RETURNING {r}",
        r = cols("r")
    ),
    renew_expired: format!(
        "WITH t AS ({NOW})
         UPDATE records r SET id = $3, fingerprint = $4, class = $5, route = $6,
             principal = $7, state = 'processing', owner = $8, attempt = 1,
             lease_until = t.now + $9, created_at = t.now, updated_at = t.now,
             completed_at = NULL, expires_at = NULL, response_status = NULL,
             response_headers = NULL, response_body = NULL, units = 0, repeats = 0,
             repeat_units = 0, workflow_id = $10, provider_request_id = NULL,
             last_error = NULL, waiting = 0
         FROM t
         WHERE r.id = $2 AND ((r.state = 'completed'
           AND (r.expires_at IS NULL OR r.expires_at <= t.now))
           OR (r.state = 'released' AND r.expires_at <= t.now))
         RETURNING {r}",
        r = cols("r")
    ),
    // $5 window ms, $6 replay_until, $7 status, $8 headers, $9 body, $10 units, $11 req id
    complete: fenced_update(
        "state = 'completed', lease_until = NULL, completed_at = t.now,
         expires_at = LEAST(t.now + $5, COALESCE($6, 9223372036854775807)),
         response_status = $7, response_headers = $8, response_body = $9, units = $10,
         provider_request_id = COALESCE($11, r.provider_request_id), updated_at = t.now,
         last_error = NULL",
        true,
    ),
    release: fenced_update(
        "state = 'released', lease_until = NULL, updated_at = t.now, last_error = $5,
         expires_at = t.now + $6",
        true,
    ),
    mark_unknown: fenced_update(
        "state = 'outcome_unknown', lease_until = NULL, updated_at = t.now, last_error = $5",
        true,
    ),
    renew: fenced_update("lease_until = t.now + $5, updated_at = t.now", false),
    lock: format!(
        "WITH t AS ({NOW})
         SELECT t.now, {r} FROM records r, t WHERE r.id = $2 FOR UPDATE OF r",
        r = cols("r")
    ),
    write: format!(
        "WITH u AS (
             UPDATE records SET state = $2, owner = $3, attempt = $4, lease_until = $5,
                 updated_at = $6, completed_at = $7, expires_at = $8, response_status = $9,
                 response_headers = $10, response_body = $11, units = $12,
                 provider_request_id = $13, last_error = $14
             WHERE id = $1
             RETURNING id, state, waiting)
         SELECT CASE WHEN u.waiting > 0 AND u.state <> 'processing'
                     THEN pg_notify('{}', u.id) END
         FROM u",
        listener::CHANNEL
    ),
    get: format!("SELECT {} FROM records WHERE id = $1", COLUMNS.join(", ")),
    lookup: format!(
        "SELECT {} FROM records WHERE scope = $1 AND key = $2",
        COLUMNS.join(", ")
    ),
    wait_start: format!(
        "UPDATE records SET waiting = waiting + 1
         WHERE id = $1 AND state = 'processing'
         RETURNING {}",
        COLUMNS.join(", ")
    ),
    wait_end: "UPDATE records SET waiting = GREATEST(waiting - 1, 0) WHERE id = $1".into(),
    list: format!(
        "SELECT {} FROM records
         WHERE ($1::text IS NULL OR state = $1)
           AND ($2::text IS NULL OR principal = $2)
           AND ($3::text IS NULL OR route = $3)
         ORDER BY created_at DESC, id DESC
         LIMIT $4",
        COLUMNS.join(", ")
    ),
    purge: format!(
        "WITH t AS ({NOW})
         DELETE FROM records r USING t
         WHERE (r.state = 'completed' AND (r.expires_at IS NULL OR r.expires_at <= t.now))
            OR (r.state = 'released' AND r.expires_at <= t.now)"
    ),
    add_repeats: "UPDATE records SET repeats = repeats + $2, repeat_units = repeat_units + $3
                  WHERE id = $1"
        .into(),
    record_repeats: "WITH u AS (
             UPDATE records SET repeats = repeats + $2, repeat_units = repeat_units + $3
             WHERE id = $1
             RETURNING id, principal, route, expires_at)
         INSERT INTO repeat_events (record_id, principal, route, at, kind, units, expires_at)
         SELECT u.id, u.principal, u.route, e.at, e.kind, e.units, u.expires_at
         FROM u, unnest($4::bigint[], $5::text[], $6::bigint[]) AS e(at, kind, units)"
        .into(),
    repeat_totals: "SELECT count(*)::bigint, COALESCE(sum(units), 0)::bigint FROM repeat_events
                    WHERE principal = $1 AND at >= $2"
        .into(),
    repeat_list: "SELECT record_id, route, at, kind, units FROM repeat_events
                  WHERE principal = $1 AND at >= $2 ORDER BY at, seq LIMIT $3"
        .into(),
    purge_repeats: format!(
        "WITH t AS ({NOW})
         DELETE FROM repeat_events e USING t
         WHERE e.expires_at IS NULL OR e.expires_at <= t.now"
    ),
    usage: "SELECT principal, count(*)::bigint AS fresh,
                   COALESCE(sum(units), 0)::bigint AS fresh_units,
                   COALESCE(sum(repeats), 0)::bigint AS repeats,
                   COALESCE(sum(repeat_units), 0)::bigint AS repeat_units
            FROM records
            WHERE state = 'completed' AND completed_at IS NOT NULL
              AND ($1::bigint IS NULL OR completed_at >= $1)
            GROUP BY principal"
        .into(),
    now: NOW.to_string(),
});

/// The response of a record as its three columns.
struct ResponseColumns {
    status: Option<i32>,
    headers: Option<String>,
    body: Option<Vec<u8>>,
}

impl ResponseColumns {
    fn of(response: Option<&StoredResponse>) -> Result<ResponseColumns> {
        Ok(match response {
            None => ResponseColumns {
                status: None,
                headers: None,
                body: None,
            },
            Some(r) => ResponseColumns {
                status: Some(i32::from(r.status)),
                headers: Some(
                    serde_json::to_string(&r.headers)
                        .map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?,
                ),
                body: r.body.as_ref().map(|b| b.to_vec()),
            },
        })
    }
}

fn record_from_row(row: &Row) -> Result<Record> {
    fn opt_ts(row: &Row, col: &str) -> Result<Option<Timestamp>> {
        Ok(row
            .try_get::<_, Option<i64>>(col)
            .map_err(corrupt)?
            .map(Timestamp))
    }
    let get_str = |col: &str| row.try_get::<_, String>(col).map_err(corrupt);
    let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(corrupt)?;
    let fingerprint = Fingerprint(
        fingerprint
            .try_into()
            .map_err(|_| StoreError::Corrupt("a fingerprint is not 32 bytes".into()))?,
    );
    let status: Option<i32> = row.try_get("response_status").map_err(corrupt)?;
    let response = match status {
        None => None,
        Some(status) => {
            let headers: Option<String> = row.try_get("response_headers").map_err(corrupt)?;
            Some(StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| StoreError::Corrupt(format!("response status {status}")))?,
                headers: match headers {
                    None => Vec::new(),
                    Some(h) => serde_json::from_str(&h)
                        .map_err(|e| StoreError::Corrupt(format!("response headers: {e}")))?,
                },
                body: row
                    .try_get::<_, Option<Vec<u8>>>("response_body")
                    .map_err(corrupt)?
                    .map(bytes::Bytes::from),
            })
        }
    };
    let attempt: i32 = row.try_get("attempt").map_err(corrupt)?;
    Ok(Record {
        id: RecordId(get_str("id")?),
        scope: Scope::from_stored(get_str("scope")?),
        key: get_str("key")?,
        fingerprint,
        class: get_str("class")?.parse().map_err(StoreError::Corrupt)?,
        route: get_str("route")?,
        principal: get_str("principal")?,
        state: get_str("state")?.parse().map_err(StoreError::Corrupt)?,
        owner: row.try_get("owner").map_err(corrupt)?,
        attempt: u32::try_from(attempt)
            .map_err(|_| StoreError::Corrupt(format!("attempt {attempt}")))?,
        lease_until: opt_ts(row, "lease_until")?,
        created_at: Timestamp(row.try_get("created_at").map_err(corrupt)?),
        updated_at: Timestamp(row.try_get("updated_at").map_err(corrupt)?),
        completed_at: opt_ts(row, "completed_at")?,
        expires_at: opt_ts(row, "expires_at")?,
        response,
        units: unsigned(row, "units")?,
        repeats: unsigned(row, "repeats")?,
        repeat_units: unsigned(row, "repeat_units")?,
        workflow_id: row.try_get("workflow_id").map_err(corrupt)?,
        provider_request_id: row.try_get("provider_request_id").map_err(corrupt)?,
        last_error: row.try_get("last_error").map_err(corrupt)?,
    })
}

fn unsigned(row: &Row, col: &str) -> Result<u64> {
    let v: i64 = row.try_get(col).map_err(corrupt)?;
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{col} is {v}")))
}

/// A duration in ms, capped so that adding it to a time cannot overflow a bigint.
fn millis(d: Duration) -> i64 {
    d.as_millis().min(1_000_000_000_000_000) as i64
}

/// Attempts are `integer` in the table.
fn attempt_param(attempt: u32) -> i32 {
    i32::try_from(attempt).unwrap_or(i32::MAX)
}

/// The text of a driver error, with the server's message when there is one.
pub(crate) fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => oncely_core::error_chain(e),
    }
}

pub(crate) fn unavailable(e: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(format!("PostgreSQL: {}", error_text(&e)))
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => unavailable(e),
        PoolError::Timeout(kind) => StoreError::Unavailable(format!(
            "PostgreSQL: no connection within {POOL_TIMEOUT:?} ({kind:?})"
        )),
        other => StoreError::Unavailable(format!("PostgreSQL pool: {other}")),
    }
}

fn corrupt(e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(error_text(&e))
}
