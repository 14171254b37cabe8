//! The PostgreSQL store's [`Waiting`]: `wait_for` counts itself in the row's `waiting`
//! column while it waits, so that a transition out of `processing` sends `NOTIFY` only
//! when someone waits; the listener of every instance wakes its local waiters.

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use oncely_core::{Record, RecordId, State, Timestamp};

use super::connection::checkout;
use super::error::corrupt;
use super::rows::record_from_row;
use super::sql::SQL;
use super::store::PgStore;
use crate::{watch, Ledger, Result, StoreError, Waiting};

impl PgStore {
    /// Counts a waiter in the row if it is processing, and returns the row either way.
    async fn start_waiting(&self, id: &RecordId) -> Result<(Option<Record>, bool)> {
        if let Some(row) = self
            .query_opt(&SQL.wait_start, &[&self.offset(), &id.0])
            .await?
        {
            // A processing record, its lease as this process observed it (`crate::watch`).
            let now = Timestamp(row.try_get("now").map_err(corrupt)?);
            let record = watch::as_observed(record_from_row(&row)?, now, self.monotonic());
            return Ok((Some(record), true));
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
                if let Ok(client) = checkout(&pool).await {
                    if let Ok(stmt) = client.prepare_cached(&SQL.wait_end).await {
                        let _ = client.execute(&stmt, &[&id]).await;
                    }
                }
            });
        }
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
