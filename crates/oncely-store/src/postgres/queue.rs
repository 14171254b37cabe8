//! The task queue on PostgreSQL (table `tasks`, migration 2).
//!
//! - `claim_with_task` is one transaction: each key is locked (`SELECT ... FOR UPDATE`)
//!   or inserted with `ON CONFLICT DO NOTHING`, and decided like a single claim: an
//!   expired completed row is replaced by a new record, a released row with the same
//!   fingerprint is reclaimed in place (attempt + 1), and any other existing key rolls
//!   everything back.
//!   Two instances that insert the same new key at once serialise on the unique index:
//!   the second's insert does nothing once the first commits, and it reports the first's
//!   record.
//! - `lease_tasks` is one statement: the due rows are picked `FOR UPDATE SKIP LOCKED`
//!   (rows another instance is leasing right now are skipped, not waited for) and updated
//!   in place, so two instances never lease one task at a time.
//! - `lease_tasks_capped` runs that statement in a transaction that first takes a
//!   transaction-scoped advisory lock on the kind and counts its live running tasks, so
//!   the instances' capped leases of one kind take turns and never exceed the cap.
//! - Finishing is one `UPDATE` (or `DELETE` when done) fenced by owner, attempt and state.
//! - Times are the database's clock plus the store clock's offset, like the records.

use async_trait::async_trait;
use std::time::Duration;

use oncely_core::{ClaimSpec, Completion, Record, Scope, Timestamp};
use tokio_postgres::Row;

use super::error::{corrupt, unavailable};
use super::rows::{record_from_row, ResponseColumns, COLUMNS};
use super::sql::NOW;
use super::store::PgStore;
use crate::plan::plan_claims;
use crate::queue::{headers_from_json, headers_to_json, LAPSED_ON_LAST_ATTEMPT};
use crate::Ledger;
use crate::{
    new_record_id, Claim, Finished, NewTask, Result, StoreError, Task, TaskCounts, TaskError,
    TaskFence, TaskId, TaskOutcome, TaskQueue, TaskState,
};

const TASK_COLUMNS: &str = "id, kind, record, target, method, headers, body, state, attempts, \
                            max_attempts, timeout_ms, backoff_ms, next_at, owner, lease_until, \
                            last_error, created_at, updated_at";

/// Migration 2: the task queue.
pub(super) const MIGRATION_SQL: &str = r#"
CREATE TABLE tasks (
    id           text PRIMARY KEY,
    kind         text NOT NULL,
    record       text,
    target       text NOT NULL,
    method       text NOT NULL,
    headers      text NOT NULL,
    body         bytea,
    state        text NOT NULL CHECK (state IN ('pending', 'running', 'dead')),
    attempts     integer NOT NULL,
    max_attempts integer NOT NULL,
    timeout_ms   bigint NOT NULL,
    backoff_ms   bigint NOT NULL,
    next_at      bigint NOT NULL,
    owner        text,
    lease_until  bigint,
    last_error   text,
    created_at   bigint NOT NULL,
    updated_at   bigint NOT NULL
);
CREATE INDEX tasks_pending ON tasks (kind, next_at) WHERE state = 'pending';
CREATE INDEX tasks_running ON tasks (kind, lease_until) WHERE state = 'running';
CREATE INDEX tasks_state ON tasks (kind, state, created_at);
CREATE INDEX tasks_record ON tasks (record);
"#;

fn task_from_row(row: &Row) -> Result<Task> {
    let get_i64 = |c: &str| row.try_get::<_, i64>(c).map_err(corrupt);
    let get_u32 = |c: &str| {
        row.try_get::<_, i32>(c)
            .map_err(corrupt)
            .map(|v| v.max(0) as u32)
    };
    let headers: String = row.try_get("headers").map_err(corrupt)?;
    let state: String = row.try_get("state").map_err(corrupt)?;
    Ok(Task {
        id: TaskId(row.try_get("id").map_err(corrupt)?),
        kind: row.try_get("kind").map_err(corrupt)?,
        record: row
            .try_get::<_, Option<String>>("record")
            .map_err(corrupt)?
            .map(oncely_core::RecordId),
        target: row.try_get("target").map_err(corrupt)?,
        method: row.try_get("method").map_err(corrupt)?,
        headers: headers_from_json(&headers).map_err(StoreError::Corrupt)?,
        body: row
            .try_get::<_, Option<Vec<u8>>>("body")
            .map_err(corrupt)?
            .unwrap_or_default(),
        state: state.parse().map_err(StoreError::Corrupt)?,
        attempts: get_u32("attempts")?,
        max_attempts: get_u32("max_attempts")?,
        timeout: Duration::from_millis(get_i64("timeout_ms")?.max(0) as u64),
        backoff: Duration::from_millis(get_i64("backoff_ms")?.max(0) as u64),
        next_at: Timestamp(get_i64("next_at")?),
        owner: row.try_get("owner").map_err(corrupt)?,
        lease_until: row
            .try_get::<_, Option<i64>>("lease_until")
            .map_err(corrupt)?
            .map(Timestamp),
        last_error: row.try_get("last_error").map_err(corrupt)?,
        created_at: Timestamp(get_i64("created_at")?),
        updated_at: Timestamp(get_i64("updated_at")?),
    })
}

fn i32_of(v: u32) -> i32 {
    v.min(i32::MAX as u32) as i32
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

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

/// Leases up to `$3` due tasks of kind `$2` to `$4` for `$5` ms (`$6`: the error of a
/// task that lapsed on its last attempt and is dead instead).
static LEASE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH t AS ({NOW}),
         due AS (
             SELECT k.id FROM tasks k, t
             WHERE k.kind = $2 AND ((k.state = 'pending' AND k.next_at <= t.now)
                OR (k.state = 'running' AND k.lease_until <= t.now
                    AND t.up >= k.lease_until - k.updated_at))
             ORDER BY CASE WHEN k.state = 'running' THEN k.lease_until ELSE k.next_at END, k.id
             LIMIT $3
             FOR UPDATE OF k SKIP LOCKED)
         UPDATE tasks k SET
             state = CASE WHEN lapsed THEN 'dead' ELSE 'running' END,
             attempts = CASE WHEN lapsed THEN k.attempts ELSE k.attempts + 1 END,
             owner = CASE WHEN lapsed THEN NULL ELSE $4 END,
             lease_until = CASE WHEN lapsed THEN NULL ELSE t.now + $5 END,
             last_error = CASE WHEN lapsed THEN $6 ELSE k.last_error END,
             updated_at = t.now
         FROM (SELECT d.id, (s.state = 'running' AND s.attempts >= s.max_attempts) AS lapsed
               FROM due d JOIN tasks s ON s.id = d.id) x, t
         WHERE k.id = x.id
         RETURNING {cols}",
        cols = TASK_COLUMNS
            .split(", ")
            .map(|c| format!("k.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
});

/// The tasks a lease statement returned that it leased (not those it made dead).
fn leased(rows: &[Row]) -> Result<Vec<Task>> {
    let mut tasks = rows.iter().map(task_from_row).collect::<Result<Vec<_>>>()?;
    tasks.retain(|t| t.state == TaskState::Running);
    tasks.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(tasks)
}

#[async_trait]
impl TaskQueue for PgStore {
    async fn claim_with_task(
        &self,
        specs: &[ClaimSpec],
        completion: Option<Completion>,
        task: NewTask,
    ) -> Result<Claim> {
        if specs.is_empty() {
            return Err(StoreError::Config(
                "claim_with_task needs at least one claim".into(),
            ));
        }
        if specs.len() == 1 {
            if let Some(claim) = self
                .claim_new_with_task(&specs[0], completion.as_ref(), &task)
                .await?
            {
                return Ok(claim);
            }
        }
        for _ in 0..8 {
            match self
                .claim_with_task_round(specs, completion.as_ref(), &task)
                .await?
            {
                Some(claim) => return Ok(claim),
                None => continue,
            }
        }
        Err(StoreError::Unavailable(
            "the claim kept racing with other writers; try again".into(),
        ))
    }

    async fn lease_tasks(
        &self,
        kind: &str,
        owner: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        let max = max.min(i64::MAX as usize) as i64;
        let rows = self
            .query(
                &LEASE_SQL,
                &[
                    &self.offset(),
                    &kind,
                    &max,
                    &owner,
                    &ms(lease),
                    &LAPSED_ON_LAST_ATTEMPT,
                ],
            )
            .await?;
        leased(&rows)
    }

    /// One transaction that takes the kind's advisory lock (so capped leases of one kind
    /// on every instance run one at a time), counts the live running tasks, and leases
    /// what the cap leaves.
    async fn lease_tasks_capped(
        &self,
        kind: &str,
        owner: &str,
        max_running: usize,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        let offset = self.offset();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(unavailable)?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('oncely tasks ' || $1::text, 0))",
            &[&kind],
        )
        .await
        .map_err(unavailable)?;
        let live: i64 = tx
            .query_one(
                &format!(
                    "WITH t AS ({NOW}) SELECT count(*)::bigint FROM tasks k, t \
                     WHERE k.kind = $2 AND k.state = 'running' AND k.lease_until > t.now"
                ),
                &[&offset, &kind],
            )
            .await
            .map_err(unavailable)?
            .try_get(0)
            .map_err(corrupt)?;
        let free = max_running.saturating_sub(live.max(0) as usize);
        if free == 0 {
            return Ok(Vec::new());
        }
        let max = free.min(i64::MAX as usize) as i64;
        let stmt = tx.prepare_cached(&LEASE_SQL).await.map_err(unavailable)?;
        let rows = tx
            .query(
                &stmt,
                &[
                    &offset,
                    &kind,
                    &max,
                    &owner,
                    &ms(lease),
                    &LAPSED_ON_LAST_ATTEMPT,
                ],
            )
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        leased(&rows)
    }

    async fn renew_task(&self, fence: &TaskFence, lease: Duration) -> Result<()> {
        let sql = format!(
            "WITH t AS ({NOW})
             UPDATE tasks k SET lease_until = t.now + $5, updated_at = t.now
             FROM t
             WHERE k.id = $2 AND k.owner = $3 AND k.attempts = $4 AND k.state = 'running'
             RETURNING k.id"
        );
        self.query_opt(
            &sql,
            &[
                &self.offset(),
                &fence.id.0,
                &fence.owner,
                &i32_of(fence.attempt),
                &ms(lease),
            ],
        )
        .await?
        .map(|_| ())
        .ok_or_else(|| {
            StoreError::Task(TaskError::Fenced {
                id: fence.id.clone(),
                attempt: fence.attempt,
            })
        })
    }

    async fn finish_task(&self, fence: &TaskFence, outcome: TaskOutcome) -> Result<Finished> {
        let attempt = i32_of(fence.attempt);
        let fenced = || {
            StoreError::Task(TaskError::Fenced {
                id: fence.id.clone(),
                attempt: fence.attempt,
            })
        };
        let done = match outcome {
            TaskOutcome::Done => {
                let row = self
                    .query_opt(
                        "DELETE FROM tasks WHERE id = $1 AND owner = $2 AND attempts = $3 \
                         AND state = 'running' RETURNING id",
                        &[&fence.id.0, &fence.owner, &attempt],
                    )
                    .await?;
                return row.map(|_| Finished::Done).ok_or_else(fenced);
            }
            TaskOutcome::Retry { at, error } => (Some(at), error),
            TaskOutcome::Dead { error } => (None, error),
        };
        let (at, error) = done;
        let sql = format!(
            "WITH t AS ({NOW})
             UPDATE tasks k SET
                 state = CASE WHEN $5::bigint IS NOT NULL AND k.attempts < k.max_attempts
                              THEN 'pending' ELSE 'dead' END,
                 next_at = COALESCE($5, k.next_at), last_error = $6, owner = NULL,
                 lease_until = NULL, updated_at = t.now
             FROM t
             WHERE k.id = $2 AND k.owner = $3 AND k.attempts = $4 AND k.state = 'running'
             RETURNING k.state, k.next_at"
        );
        let row = self
            .query_opt(
                &sql,
                &[
                    &self.offset(),
                    &fence.id.0,
                    &fence.owner,
                    &attempt,
                    &at.map(|a| a.0),
                    &error,
                ],
            )
            .await?
            .ok_or_else(fenced)?;
        let state: String = row.try_get(0).map_err(corrupt)?;
        Ok(if state == "pending" {
            Finished::Retrying(Timestamp(row.try_get(1).map_err(corrupt)?))
        } else {
            Finished::Dead
        })
    }

    async fn get_task(&self, id: &TaskId) -> Result<Option<Task>> {
        self.query_opt(
            &format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"),
            &[&id.0],
        )
        .await?
        .map(|row| task_from_row(&row))
        .transpose()
    }

    async fn list_tasks(&self, kind: &str, state: Option<TaskState>) -> Result<Vec<Task>> {
        let state = state.map(|s| s.as_str());
        let rows = self
            .query(
                &format!(
                    "SELECT {TASK_COLUMNS} FROM tasks WHERE kind = $1 \
                     AND ($2::text IS NULL OR state = $2) ORDER BY created_at, id"
                ),
                &[&kind, &state],
            )
            .await?;
        rows.iter().map(task_from_row).collect()
    }

    async fn requeue_task(&self, id: &TaskId) -> Result<Task> {
        let sql = format!(
            "WITH t AS ({NOW})
             UPDATE tasks k SET state = 'pending', attempts = 0, next_at = t.now,
                 updated_at = t.now
             FROM t WHERE k.id = $2 AND k.state = 'dead'
             RETURNING {cols}",
            cols = TASK_COLUMNS
                .split(", ")
                .map(|c| format!("k.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some(row) = self.query_opt(&sql, &[&self.offset(), &id.0]).await? {
            return task_from_row(&row);
        }
        Err(match self.get_task(id).await? {
            None => TaskError::NotFound(id.clone()),
            Some(t) => TaskError::WrongState {
                id: id.clone(),
                state: t.state,
                action: "requeue",
            },
        }
        .into())
    }

    async fn task_counts(&self, kind: &str) -> Result<TaskCounts> {
        let rows = self
            .query(
                "SELECT state, count(*)::bigint FROM tasks WHERE kind = $1 GROUP BY state",
                &[&kind],
            )
            .await?;
        let mut counts = TaskCounts::default();
        for row in rows {
            let state: String = row.try_get(0).map_err(corrupt)?;
            let n = row.try_get::<_, i64>(1).map_err(corrupt)?.max(0) as u64;
            match state.parse::<TaskState>().map_err(StoreError::Corrupt)? {
                TaskState::Pending => counts.pending = n,
                TaskState::Running => counts.running = n,
                TaskState::Dead => counts.dead = n,
            }
        }
        Ok(counts)
    }
}

impl PgStore {
    /// The common case in one statement (one round trip): a single key that no row
    /// holds. Inserts the record and the task together, or nothing (`None`: the key is
    /// held, and the full transaction decides).
    async fn claim_new_with_task(
        &self,
        spec: &ClaimSpec,
        completion: Option<&Completion>,
        task: &NewTask,
    ) -> Result<Option<Claim>> {
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "WITH t AS ({NOW}),
                 ins AS (
                     INSERT INTO records (id, scope, key, fingerprint, class, route, principal,
                         state, owner, attempt, lease_until, created_at, updated_at,
                         completed_at, expires_at, response_status, response_headers,
                         response_body, units, provider_request_id, workflow_id)
                     SELECT $2, $3, $4, $5, $6, $7, $8, $9::text, $10, 1,
                         CASE WHEN $9::text = 'processing' THEN t.now + $11::bigint END,
                         t.now, t.now,
                         CASE WHEN $9::text = 'completed' THEN t.now END,
                         CASE WHEN $9::text = 'completed' THEN
                             LEAST(t.now + $12::bigint,
                                   COALESCE($13::bigint, 9223372036854775807)) END,
                         $14, $15, $16, $17, $18, $19
                     FROM t
                     ON CONFLICT (scope, key) DO NOTHING
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
                ],
            )
            .await?;
        row.map(|row| record_from_row(&row).map(Claim::Owned))
            .transpose()
    }

    async fn claim_with_task_round(
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
            "SELECT {} FROM records WHERE scope = $1 AND key = $2 FOR UPDATE",
            COLUMNS.join(", ")
        );
        let insert = "INSERT INTO records (id, scope, key, fingerprint, class, route, principal,
                 state, owner, attempt, lease_until, created_at, updated_at, completed_at,
                 expires_at, response_status, response_headers, response_body, units,
                 workflow_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                 $17, $18, $19, $20)
             ON CONFLICT (scope, key) DO NOTHING
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
            let row = tx
                .query_opt(&lock, &[&spec.scope.as_str(), &spec.key])
                .await
                .map_err(unavailable)?
                .map(|row| record_from_row(&row))
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
        Ok(Some(Claim::Owned(first)))
    }
}
