//! Claims that enqueue a task on PostgreSQL (`TaskQueue::claim_with_task`).
//!
//! - A single new key costs one statement: the record and the task are inserted
//!   together, or nothing when a row already holds the key.
//! - Otherwise it is one transaction: each key is locked (`SELECT ... FOR UPDATE`)
//!   or inserted with `ON CONFLICT DO NOTHING`, and decided like a single claim: an
//!   expired completed row is replaced by a new record, a released row with the same
//!   fingerprint is reclaimed in place (attempt + 1), and any other existing key rolls
//!   everything back.
//!   Keys are found by their claim hash (`Scope::claim_hash`, migration 8), and the row
//!   found must hold the key itself (a colliding hash is refused).
//!   Two instances that insert the same new key at once serialise on the unique index:
//!   the second's insert does nothing once the first commits, and it reports the first's
//!   record.

use oncely_core::{ClaimSpec, Completion, Record, Scope, Timestamp};

use super::error::{corrupt, unavailable};
use super::queue::{i32_of, ms, TASK_COLUMNS};
use super::rows::{holding, record_from_row, ResponseColumns, COLUMNS};
use super::sql::NOW;
use super::store::PgStore;
use crate::plan::plan_claims;
use crate::queue::headers_to_json;
use crate::{new_record_id, Claim, Ledger, NewTask, Result, StoreError, Task, TaskId};

/// A claim-with-task round's answer: `None` when a row moved between its statements
/// (purged, or committed after its snapshot) and another round must decide.
type Round = Option<Claim>;

/// Writes back what a reclaim (and completion) changed in a locked record.
async fn rewrite(tx: &tokio_postgres::Transaction<'_>, record: &Record) -> Result<()> {
    let response = ResponseColumns::of(record.response.as_ref())?;
    let changed = tx
        .execute(
            "UPDATE records SET state = $2, owner = $3, attempt = $4, lease_until = $5,
                 updated_at = $6, completed_at = $7, expires_at = $8, response_status = $9,
                 response_headers = $10, response_body = $11, units = $12,
                 provider_request_id = $13, last_error = $14, workflow_id = $15
             WHERE id = $1",
            &[
                &record.id.0,
                &record.state.as_str(),
                &record.owner,
                &i32_of(record.attempt),
                &record.lease_until.map(|t| t.0),
                &record.updated_at.0,
                &record.completed_at.map(|t| t.0),
                &record.expires_at.map(|t| t.0),
                &response.status,
                &response.headers,
                &response.body,
                &(record.units as i64),
                &record.provider_request_id,
                &record.last_error,
                &record.workflow_id,
            ],
        )
        .await
        .map_err(unavailable)?;
    if changed == 0 {
        return Err(StoreError::NotFound(record.id.clone()));
    }
    Ok(())
}

impl PgStore {
    /// The common case in one statement (one round trip): a single key that no row
    /// holds. Inserts the record and the task together, or nothing (`None`: the key is
    /// held, and the full transaction decides).
    pub(super) async fn claim_new_with_task(
        &self,
        spec: &ClaimSpec,
        completion: Option<&Completion>,
        task: &NewTask,
    ) -> Result<Option<Claim>> {
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "WITH t AS ({NOW}),
                 ins AS (
                     INSERT INTO records (id, claim, scope, key, fingerprint, class, route,
                         principal, state, owner, attempt, lease_until, created_at, updated_at,
                         completed_at, expires_at, response_status, response_headers,
                         response_body, units, provider_request_id, workflow_id)
                     SELECT $2, $29, $3, $4, $5, $6, $7, $8, $9::text, $10, 1,
                         CASE WHEN $9::text = 'processing' THEN t.now + $11::bigint END,
                         t.now, t.now,
                         CASE WHEN $9::text = 'completed' THEN t.now END,
                         CASE WHEN $9::text = 'completed' THEN
                             LEAST(t.now + $12::bigint,
                                   COALESCE($13::bigint, 9223372036854775807)) END,
                         $14, $15, $16, $17, $18, $19
                     FROM t
                     ON CONFLICT (claim) DO NOTHING
                     RETURNING {cols}),
                 queued AS (
                     INSERT INTO tasks ({TASK_COLUMNS})
                     SELECT $20, $21, ins.id, $22, $23, $24, $25, 'pending', 0, $26, $27, $28,
                         t.now, NULL, NULL, NULL, t.now, t.now
                     FROM ins, t
                     RETURNING id)
                 SELECT ins.* FROM ins, queued",
                cols = COLUMNS.join(", ")
            )
        });
        let state = if completion.is_some() {
            "completed"
        } else {
            "processing"
        };
        let response = ResponseColumns::of(completion.map(|c| &c.response))?;
        let units = completion.map_or(0, |c| c.units as i64);
        let window = completion.map_or(0, |c| ms(c.window));
        let replay_until = completion.and_then(|c| c.replay_until.map(|t| t.0));
        let provider_request_id = completion.and_then(|c| c.provider_request_id.clone());
        let id = new_record_id();
        let task_id = TaskId::new();
        let headers = headers_to_json(&task.headers);
        let max_attempts = i32_of(task.max_attempts.max(1));
        let row = self
            .query_opt(
                &SQL,
                &[
                    &self.offset(),
                    &id.0,
                    &spec.scope.as_str(),
                    &spec.key,
                    &spec.fingerprint.0.as_slice(),
                    &spec.class.as_str(),
                    &spec.route,
                    &spec.principal,
                    &state,
                    &spec.owner,
                    &ms(spec.lease),
                    &window,
                    &replay_until,
                    &response.status,
                    &response.headers,
                    &response.body,
                    &units,
                    &provider_request_id,
                    &spec.workflow_id,
                    &task_id.0,
                    &task.kind,
                    &task.target,
                    &task.method,
                    &headers,
                    &task.body,
                    &max_attempts,
                    &ms(task.timeout),
                    &ms(task.backoff),
                    &spec.scope.claim_hash(&spec.key).as_slice(),
                ],
            )
            .await?;
        row.map(|row| record_from_row(&row).map(|r| self.owned(r)))
            .transpose()
    }

    /// One round of the full transaction: locks or inserts every key, decides them
    /// with one plan, and inserts the task; `None` when a row moved meanwhile.
    pub(super) async fn claim_with_task_round(
        &self,
        specs: &[ClaimSpec],
        completion: Option<&Completion>,
        task: &NewTask,
    ) -> Result<Round> {
        let offset = self.offset();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(unavailable)?;
        let now_row = tx.query_one(NOW, &[&offset]).await.map_err(unavailable)?;
        let now = Timestamp(now_row.try_get("now").map_err(corrupt)?);
        let lock = format!(
            "SELECT {} FROM records WHERE claim = $1 FOR UPDATE",
            COLUMNS.join(", ")
        );
        let insert = "INSERT INTO records (id, scope, key, fingerprint, class, route, principal,
                 state, owner, attempt, lease_until, created_at, updated_at, completed_at,
                 expires_at, response_status, response_headers, response_body, units,
                 workflow_id, claim)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                 $17, $18, $19, $20, $21)
             ON CONFLICT (claim) DO NOTHING
             RETURNING id";
        let lock = tx.prepare_cached(&lock).await.map_err(unavailable)?;
        let insert = tx.prepare_cached(insert).await.map_err(unavailable)?;
        // The rows holding the keys, locked for this transaction, then the one plan.
        let mut held: Vec<(&Scope, &str, Option<Record>)> = Vec::new();
        for spec in specs {
            if held
                .iter()
                .any(|(s, k, _)| **s == spec.scope && *k == spec.key)
            {
                continue;
            }
            let claim = spec.scope.claim_hash(&spec.key);
            let row = tx
                .query_opt(&lock, &[&claim.as_slice()])
                .await
                .map_err(unavailable)?
                .map(|row| holding(record_from_row(&row)?, &spec.scope, &spec.key))
                .transpose()?;
            held.push((&spec.scope, &spec.key, row));
        }
        let plan = plan_claims(specs, completion.cloned(), now, |scope, key| {
            Ok(held
                .iter()
                .find(|(s, k, _)| *s == scope && *k == key)
                .and_then(|(_, _, row)| row.clone()))
        })?;
        let records = match plan {
            Ok(records) => records,
            Err(existing) => {
                drop(tx);
                return Ok(Some(Claim::Existing(existing)));
            }
        };
        for (replaces, record) in &records {
            match replaces {
                Some(old) if *old == record.id => {
                    // A released row with the same fingerprint, locked above: executed
                    // again under the same id (attempt + 1), its work queued again; a
                    // task of this kind still held for it is stale (its worker stopped
                    // before finishing it): only the new one runs.
                    rewrite(&tx, record).await?;
                    tx.execute(
                        "DELETE FROM tasks WHERE record = $1 AND kind = $2",
                        &[&record.id.0, &task.kind],
                    )
                    .await
                    .map_err(unavailable)?;
                    continue;
                }
                Some(old) => {
                    // An expired record renewed: it leaves the ledger, its count stays.
                    tx.execute(&super::sql::fold_record_sql(), &[&old.0])
                        .await
                        .map_err(unavailable)?;
                    tx.execute("DELETE FROM records WHERE id = $1", &[&old.0])
                        .await
                        .map_err(unavailable)?;
                }
                None => {}
            }
            let response = ResponseColumns::of(record.response.as_ref())?;
            let attempt = i32_of(record.attempt);
            let units = record.units as i64;
            let inserted = tx
                .query_opt(
                    &insert,
                    &[
                        &record.id.0,
                        &record.scope.as_str(),
                        &record.key,
                        &record.fingerprint.0.as_slice(),
                        &record.class.as_str(),
                        &record.route,
                        &record.principal,
                        &record.state.as_str(),
                        &record.owner,
                        &attempt,
                        &record.lease_until.map(|t| t.0),
                        &record.created_at.0,
                        &record.updated_at.0,
                        &record.completed_at.map(|t| t.0),
                        &record.expires_at.map(|t| t.0),
                        &response.status,
                        &response.headers,
                        &response.body,
                        &units,
                        &record.workflow_id,
                        &record.scope.claim_hash(&record.key).as_slice(),
                    ],
                )
                .await
                .map_err(unavailable)?;
            if inserted.is_none() {
                // Another transaction inserted this key and committed meanwhile.
                drop(tx);
                let holder = self.lookup(&record.scope, &record.key).await?;
                return Ok(holder.map(Claim::Existing));
            }
        }
        let first = records
            .into_iter()
            .next()
            .map(|(_, r)| r)
            .expect("a granted plan has a record");
        let t = Task::new(TaskId::new(), Some(first.id.clone()), task.clone(), now);
        tx.execute(
            &format!(
                "INSERT INTO tasks ({TASK_COLUMNS}) VALUES \
                 ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)"
            ),
            &[
                &t.id.0,
                &t.kind,
                &t.record.as_ref().map(|r| r.0.clone()),
                &t.target,
                &t.method,
                &headers_to_json(&t.headers),
                &t.body,
                &t.state.as_str(),
                &i32_of(t.attempts),
                &i32_of(t.max_attempts),
                &ms(t.timeout),
                &ms(t.backoff),
                &t.next_at.0,
                &t.owner,
                &t.lease_until.map(|l| l.0),
                &t.last_error,
                &t.created_at.0,
                &t.updated_at.0,
            ],
        )
        .await
        .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(Some(self.owned(first)))
    }
}
