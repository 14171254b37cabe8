//! The reconciliation schedule on SQLite: three columns of `records` (migration 3) that
//! the record types do not carry. `reconcile_for` is the `updated_at` the schedule
//! belongs to: a record that left `outcome_unknown` and came back starts afresh.

use oncely_core::{RecordId, Timestamp};
use rusqlite::{params, Connection, OptionalExtension};

use super::error::sql_error;
use super::SqliteStore;
use crate::{ReconcileSchedule, Result};

/// A record's state, `updated_at`, and its three schedule columns.
type Row = (String, i64, Option<i64>, i64, Option<i64>);

fn current(conn: &Connection, id: &RecordId) -> Result<Option<ReconcileSchedule>> {
    let row: Option<Row> = conn
        .prepare_cached(
            "SELECT state, updated_at, reconcile_for, reconcile_attempts, reconcile_next_at \
             FROM records WHERE id = ?1",
        )
        .and_then(|mut st| {
            st.query_row([id.as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .optional()
        })
        .map_err(sql_error)?;
    Ok(match row {
        Some((state, updated_at, since, attempts, next_at)) if state == "outcome_unknown" => {
            Some(if since == Some(updated_at) {
                ReconcileSchedule {
                    attempts: attempts.clamp(0, u32::MAX as i64) as u32,
                    next_at: next_at.map(Timestamp),
                }
            } else {
                ReconcileSchedule::default()
            })
        }
        _ => None,
    })
}

impl SqliteStore {
    pub(super) async fn reconcile_get(&self, id: &RecordId) -> Result<Option<ReconcileSchedule>> {
        let id = id.clone();
        self.read(move |conn| current(conn, &id)).await
    }

    /// Compare and set, inside the writer: nothing else writes between the read and
    /// the update.
    pub(super) async fn reconcile_set(
        &self,
        id: &RecordId,
        seen: ReconcileSchedule,
        next: ReconcileSchedule,
    ) -> Result<bool> {
        let id = id.clone();
        self.writer
            .run(move |conn, _now| {
                if current(conn, &id)? != Some(seen) {
                    return Ok((false, None));
                }
                conn.prepare_cached(
                    "UPDATE records SET reconcile_for = updated_at, reconcile_attempts = ?2, \
                     reconcile_next_at = ?3 WHERE id = ?1",
                )
                .and_then(|mut st| {
                    st.execute(params![
                        id.as_str(),
                        next.attempts,
                        next.next_at.map(|t| t.0)
                    ])
                })
                .map_err(sql_error)?;
                Ok((true, None))
            })
            .await
    }
}
