//! The PostgreSQL store's [`Admin`]: listing, purging, repeat events, usage, secrets,
//! and the reconciliation schedule (`reconcile`).

use async_trait::async_trait;
use oncely_core::{Record, RecordId, State, Timestamp};

use super::error::{corrupt, unavailable};
use super::rows::{record_from_row, unsigned};
use super::sql::SQL;
use super::store::PgStore;
use crate::memory::usage_from_rows;
use crate::{
    Admin, ListFilter, ReconcileSchedule, RepeatEvent, RepeatEvents, RepeatKind, Result,
    StoreError, Usage, UsageRow,
};

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
