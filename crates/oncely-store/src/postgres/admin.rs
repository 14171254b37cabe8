//! The PostgreSQL store's [`Admin`]: listing, purging, repeat events, usage, secrets,
//! and the reconciliation schedule (`reconcile`).

use async_trait::async_trait;
use oncely_core::{Record, RecordId, State, Timestamp};

use super::error::{corrupt, unavailable};
use super::rows::record_from_row;
use super::sql::SQL;
use super::store::PgStore;
use crate::{
    Admin, ListFilter, PurgeStep, ReconcileSchedule, RepeatEvents, Result, Usage, UsageHour,
};

/// At most this many rows go in one statement of a purge.
const PURGE_BATCH: i64 = 1000;

impl PgStore {
    /// Runs the purge statement `sql` (`$1` offset, `$2` batch size) once: it deletes a
    /// batch and folds what it deleted into the usage history; returns how many rows.
    async fn purge_batch(&self, sql: &str) -> Result<i64> {
        Ok(self
            .query_opt(sql, &[&self.offset(), &PURGE_BATCH])
            .await?
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(corrupt)?
            .unwrap_or(0))
    }
}

#[async_trait]
impl Admin for PgStore {
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let state = filter.state.map(State::as_str);
        let limit = filter.limit.map(|l| l.min(i64::MAX as usize) as i64);
        let sql = match filter.state {
            Some(State::Completed) | None => &SQL.list,
            Some(_) => &SQL.list_open,
        };
        self.query(sql, &[&state, &filter.principal, &filter.route, &limit])
            .await?
            .iter()
            .map(record_from_row)
            .collect()
    }

    async fn purge_step(&self) -> Result<PurgeStep> {
        // The records first; once they are done, the repeat events whose records left.
        let records = self.purge_batch(&SQL.purge).await?;
        let events = if records < PURGE_BATCH {
            self.purge_batch(&SQL.purge_repeats).await?
        } else {
            PURGE_BATCH
        };
        if records < PURGE_BATCH && events < PURGE_BATCH {
            self.churn_purge().await?;
        }
        Ok(PurgeStep {
            records: records as u64,
            last: records < PURGE_BATCH && events < PURGE_BATCH,
        })
    }

    async fn purge_usage(&self, before: Timestamp) -> Result<u64> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("DELETE FROM usage_hours WHERE hour < $1")
            .await
            .map_err(unavailable)?;
        client
            .execute(&stmt, &[&before.0])
            .await
            .map_err(unavailable)
    }

    async fn usage_by_hour(&self, since: Option<Timestamp>) -> Result<Vec<UsageHour>> {
        self.usage_hours(since).await
    }

    async fn repeat_events(
        &self,
        principal: &str,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<RepeatEvents> {
        self.repeats_of(principal, since, limit).await
    }

    async fn usage(&self, since: Option<Timestamp>) -> Result<Usage> {
        self.usage_per_principal(since).await
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
