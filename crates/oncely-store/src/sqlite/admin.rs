//! The SQLite store's [`Admin`]: listing and usage on the read connections; purges and
//! secrets in the writer.

use async_trait::async_trait;
use oncely_core::{Record, RecordId, Timestamp};
use rusqlite::{params, OptionalExtension};

use super::error::sql_error;
use super::{repeats, rows, usage, SqliteStore};
use crate::usage::{period_start, usage_from_rows};
use crate::{
    Admin, ListFilter, PurgeStep, ReconcileSchedule, RepeatEvents, Result, StoreError, Usage,
    UsageHour,
};

#[async_trait]
impl Admin for SqliteStore {
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let filter = filter.clone();
        self.read(move |conn| rows::list(conn, &filter)).await
    }

    async fn purge_step(&self) -> Result<PurgeStep> {
        let (records, events) = self
            .writer
            .run(|conn, now| {
                let step = usage::purge_step(conn, now)?;
                super::churn::purge(conn, now)?;
                Ok((step, None))
            })
            .await?;
        let last = records < usage::PURGE_STEP as u64 && events < usage::PURGE_STEP as u64;
        Ok(PurgeStep { records, last })
    }

    async fn purge_usage(&self, before: Timestamp) -> Result<u64> {
        self.writer
            .run(move |conn, _now| Ok((usage::purge(conn, before)?, None)))
            .await
    }

    async fn usage_by_hour(&self, since: Option<Timestamp>) -> Result<Vec<UsageHour>> {
        let from = period_start(since);
        self.read(move |conn| usage::by_hour(conn, from)).await
    }

    async fn repeat_events(
        &self,
        principal: &str,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<RepeatEvents> {
        let principal = principal.to_string();
        let from = period_start(since);
        self.read(move |conn| {
            // One snapshot: a purge between the two reads would count a repeat twice or
            // not at all.
            let tx = conn.unchecked_transaction().map_err(sql_error)?;
            let mut events = repeats::list(&tx, &principal, from, limit)?;
            events.older = usage::older_repeats(&tx, &principal, from)?;
            events.total += events.older.iter().map(|h| h.repeats).sum::<u64>();
            events.total_units += events.older.iter().map(|h| h.repeat_units).sum::<u64>();
            tx.finish().map_err(sql_error)?;
            Ok(events)
        })
        .await
    }

    async fn usage(&self, since: Option<Timestamp>) -> Result<Usage> {
        let from = period_start(since);
        let rows = self
            .read(move |conn| usage::per_principal(conn, from))
            .await?;
        Ok(usage_from_rows(rows))
    }

    async fn secret(&self, name: &str) -> Result<Vec<u8>> {
        let name = name.to_string();
        self.writer
            .run(move |conn, _now| {
                let fresh = rand::random::<[u8; 32]>().to_vec();
                conn.prepare_cached("INSERT OR IGNORE INTO secrets (name, value) VALUES (?1, ?2)")
                    .and_then(|mut st| st.execute(params![name, fresh]))
                    .map_err(sql_error)?;
                let value: Option<Vec<u8>> = conn
                    .prepare_cached("SELECT value FROM secrets WHERE name = ?1")
                    .and_then(|mut st| st.query_row([&name], |row| row.get(0)).optional())
                    .map_err(sql_error)?;
                let value = value.ok_or_else(|| {
                    StoreError::Unavailable(format!("the secret {name:?} was not kept"))
                })?;
                Ok((value, None))
            })
            .await
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
