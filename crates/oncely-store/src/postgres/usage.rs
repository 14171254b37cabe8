//! The usage history on PostgreSQL (migration 7): `usage_hours`, one row per principal,
//! route and hour. The purge deletes records and repeat events with `DELETE ...
//! RETURNING`, a batch of at most 1,000 rows a statement (`SKIP LOCKED`: purges running
//! at once take different rows), and folds what it deleted in the same statement, so two
//! instances purging at once fold each row once (`crate::usage` says how each counts).
//! Readers add what the ledger still holds to it, in one statement or one snapshot.

use oncely_core::{RecordId, Timestamp};
use tokio_postgres::{IsolationLevel, Row};

use super::error::{corrupt, unavailable};
use super::rows::unsigned;
use super::sql::{fresh_of, repeats_of};
use super::store::PgStore;
use crate::usage::{period_start, usage_from_rows, Hours};
use crate::{
    RepeatEvent, RepeatEvents, RepeatKind, Result, StoreError, Usage, UsageHour, UsageRow,
};

/// The history from `$1` (an hour's start) and what the records and events add, per
/// principal, route and hour.
fn parts() -> String {
    format!(
        "SELECT hour, principal, route, fresh, fresh_units, repeats, repeat_units, joined,
                replayed FROM usage_hours WHERE hour >= $1
         UNION ALL {records}
         UNION ALL {events}",
        records = fresh_of("(SELECT * FROM records WHERE completed_at >= $1) r"),
        events = repeats_of("(SELECT * FROM repeat_events WHERE at >= $1) e"),
    )
}

fn hour_row(row: &Row) -> Result<UsageHour> {
    Ok(UsageHour {
        hour: Timestamp(row.try_get(0).map_err(corrupt)?),
        principal: row.try_get(1).map_err(corrupt)?,
        route: row.try_get(2).map_err(corrupt)?,
        fresh: count(row, 3)?,
        fresh_units: count(row, 4)?,
        repeats: count(row, 5)?,
        repeat_units: count(row, 6)?,
        joined: count(row, 7)?,
        replayed: count(row, 8)?,
    })
}

/// A count column (`bigint`).
fn count(row: &Row, i: usize) -> Result<u64> {
    Ok(row.try_get::<_, i64>(i).map_err(corrupt)? as u64)
}

impl PgStore {
    pub(super) async fn usage_hours(&self, since: Option<Timestamp>) -> Result<Vec<UsageHour>> {
        let sql = format!(
            "SELECT hour, principal, route, sum(fresh)::bigint, sum(fresh_units)::bigint,
                    sum(repeats)::bigint, sum(repeat_units)::bigint, sum(joined)::bigint,
                    sum(replayed)::bigint
             FROM ({}) p GROUP BY 1, 2, 3",
            parts()
        );
        let rows = self.query(&sql, &[&period_start(since)]).await?;
        // In the order every store gives (bytes, not the database's collation).
        let mut hours = Hours::default();
        for row in &rows {
            hours.add(&hour_row(row)?);
        }
        Ok(hours.into_rows())
    }

    pub(super) async fn usage_per_principal(&self, since: Option<Timestamp>) -> Result<Usage> {
        // Each part per principal first, then the parts together.
        let sql = "SELECT principal, sum(f)::bigint AS fresh, sum(fu)::bigint AS fresh_units,
                          sum(r)::bigint AS repeats, sum(ru)::bigint AS repeat_units FROM (
                       SELECT principal, sum(fresh) AS f, sum(fresh_units) AS fu,
                              sum(repeats) AS r, sum(repeat_units) AS ru
                       FROM usage_hours WHERE hour >= $1 GROUP BY principal
                       UNION ALL
                       SELECT principal, count(*), sum(units), 0, 0 FROM records
                       WHERE state = 'completed' AND completed_at >= $1 GROUP BY principal
                       UNION ALL
                       SELECT principal, 0, 0, sum(count), sum(units) FROM repeat_events
                       WHERE at >= $1 GROUP BY principal) p
                   GROUP BY principal";
        let rows = self.query(sql, &[&period_start(since)]).await?;
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

    /// A principal's repeats: listed while held, summed per route and hour after, in one
    /// snapshot (a purge between the reads would count a repeat twice or not at all).
    pub(super) async fn repeats_of(
        &self,
        principal: &str,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<RepeatEvents> {
        let from = period_start(since);
        let limit = limit.min(i64::MAX as usize) as i64;
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(unavailable)?;
        let totals = tx
            .query_one(
                "SELECT COALESCE(sum(count), 0)::bigint, COALESCE(sum(units), 0)::bigint
                 FROM repeat_events WHERE principal = $1 AND at >= $2",
                &[&principal, &from],
            )
            .await
            .map_err(unavailable)?;
        let listed = tx
            .query(
                "SELECT record_id, route, at, kind, count, units FROM repeat_events
                 WHERE principal = $1 AND at >= $2 ORDER BY at, seq LIMIT $3",
                &[&principal, &from, &limit],
            )
            .await
            .map_err(unavailable)?;
        let older = tx
            .query(
                "SELECT hour, principal, route, fresh, fresh_units, repeats, repeat_units,
                        joined, replayed FROM usage_hours
                 WHERE principal = $1 AND hour >= $2 AND repeats > 0 ORDER BY hour, route",
                &[&principal, &from],
            )
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        let listed = listed
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
                    count: row.try_get::<_, i64>("count").map_err(corrupt)? as u64,
                    units: row.try_get::<_, i64>("units").map_err(corrupt)? as u64,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let older = older.iter().map(hour_row).collect::<Result<Vec<_>>>()?;
        let total: i64 = totals.try_get(0).map_err(corrupt)?;
        let total_units: i64 = totals.try_get(1).map_err(corrupt)?;
        Ok(RepeatEvents {
            total: total as u64 + older.iter().map(|h| h.repeats).sum::<u64>(),
            total_units: total_units as u64 + older.iter().map(|h| h.repeat_units).sum::<u64>(),
            listed,
            older,
        })
    }
}
