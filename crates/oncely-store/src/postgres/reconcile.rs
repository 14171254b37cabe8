//! The reconciliation schedule on PostgreSQL: three columns of `records` (migration 3)
//! that the record types do not carry. `reconcile_for` is the `updated_at` the schedule
//! belongs to: a record that left `outcome_unknown` and came back starts afresh. The
//! compare and set is one conditional `UPDATE`, so instances racing for one attempt
//! cannot both win it.

use oncely_core::{RecordId, Timestamp};

use super::error::corrupt;
use super::store::PgStore;
use crate::{ReconcileSchedule, Result};

/// The schedule of the record's current stay in outcome_unknown, in SQL.
const ATTEMPTS: &str = "CASE WHEN reconcile_for = updated_at THEN reconcile_attempts ELSE 0 END";
const NEXT_AT: &str = "CASE WHEN reconcile_for = updated_at THEN reconcile_next_at END";

impl PgStore {
    pub(super) async fn reconcile_get(&self, id: &RecordId) -> Result<Option<ReconcileSchedule>> {
        let row = self
            .query_opt(
                &format!(
                    "SELECT {ATTEMPTS}, {NEXT_AT} FROM records \
                     WHERE id = $1 AND state = 'outcome_unknown'"
                ),
                &[&id.0],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let attempts: i32 = row.try_get(0).map_err(corrupt)?;
        let next_at: Option<i64> = row.try_get(1).map_err(corrupt)?;
        Ok(Some(ReconcileSchedule {
            attempts: attempts.max(0) as u32,
            next_at: next_at.map(Timestamp),
        }))
    }

    pub(super) async fn reconcile_set(
        &self,
        id: &RecordId,
        seen: ReconcileSchedule,
        next: ReconcileSchedule,
    ) -> Result<bool> {
        let row = self
            .query_opt(
                &format!(
                    "UPDATE records SET reconcile_for = updated_at, reconcile_attempts = $4, \
                     reconcile_next_at = $5 \
                     WHERE id = $1 AND state = 'outcome_unknown' AND {ATTEMPTS} = $2 \
                     AND ({NEXT_AT}) IS NOT DISTINCT FROM $3 RETURNING id"
                ),
                &[
                    &id.0,
                    &(seen.attempts.min(i32::MAX as u32) as i32),
                    &seen.next_at.map(|t| t.0),
                    &(next.attempts.min(i32::MAX as u32) as i32),
                    &next.next_at.map(|t| t.0),
                ],
            )
            .await?;
        Ok(row.is_some())
    }
}
