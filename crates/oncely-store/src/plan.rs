//! The one claim plan of `claim_with_task`: pure, rows in, writes out. Every backend
//! reads the rows holding the keys (the memory store from its maps, SQLite inside its
//! writer, PostgreSQL with the rows locked `FOR UPDATE`), asks [`plan_claims`] what to
//! write, and writes it; none decides on its own what an existing row means
//! ([`decide_claim`] does, for this plan and for a single claim alike).

use oncely_core::record::{decide_claim, ClaimDecision};
use oncely_core::{ClaimSpec, Completion, Record, RecordId, Scope, Timestamp};

use crate::{new_record_id, Result, StoreError};

/// The records an all-or-nothing claim writes (each with the id of the row it replaces),
/// or the existing record that refuses it.
pub(crate) type ClaimPlan = Result<Vec<(Option<RecordId>, Record)>, Record>;

/// Decides an all-or-nothing claim of `specs` with [`decide_claim`], like
/// [`Ledger::claim`](crate::Ledger::claim) does for one key: either every claim is granted
/// and the records to write, each with the id of the row it replaces, or the first
/// existing record that refuses it. A key no row holds gets a new record; a completed
/// row past its window is replaced by a new intention (new id, attempt 1); a released
/// row with the same fingerprint is reclaimed (same id, attempt + 1, so the same
/// downstream key) and its work queued again; a task of the same kind still held for it
/// (its worker recorded the release and stopped before finishing the task) is deleted,
/// so that only the new task runs it. With `completion`, every granted record is
/// completed at once. `find` reads the row holding a key (PostgreSQL: the rows it has
/// locked). Every backend's `claim_with_task` is this plan and the I/O around it.
pub(crate) fn plan_claims(
    specs: &[ClaimSpec],
    completion: Option<Completion>,
    now: Timestamp,
    mut find: impl FnMut(&Scope, &str) -> Result<Option<Record>>,
) -> Result<ClaimPlan> {
    if specs.is_empty() {
        return Err(StoreError::Config(
            "claim_with_task needs at least one claim".into(),
        ));
    }
    let mut out: Vec<(Option<RecordId>, Record)> = Vec::with_capacity(specs.len());
    for spec in specs {
        if out
            .iter()
            .any(|(_, r)| r.scope == spec.scope && r.key == spec.key)
        {
            continue;
        }
        let existing = find(&spec.scope, &spec.key)?;
        let (replaces, mut record) = match (decide_claim(existing.as_ref(), spec, now), existing) {
            (ClaimDecision::Insert, _) => (None, Record::new_claim(new_record_id(), spec, now)),
            (ClaimDecision::Renew, old) => (
                old.map(|r| r.id),
                Record::new_claim(new_record_id(), spec, now),
            ),
            (ClaimDecision::Reclaim, Some(mut r)) => {
                let old = r.id.clone();
                r.reclaim(ClaimDecision::Reclaim, new_record_id(), spec, now);
                (Some(old), r)
            }
            (_, existing) => {
                return Ok(Err(
                    existing.expect("an existing record decides Existing or Reclaim")
                ))
            }
        };
        if let Some(c) = &completion {
            let fence = record.fence().expect("a granted claim has a fence");
            record.complete(&fence, c.clone(), now)?;
        }
        out.push((replaces, record));
    }
    Ok(Ok(out))
}
