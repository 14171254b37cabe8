//! The task queue on PostgreSQL (table `tasks`, migration 2).
//!
//! - `claim_with_task` is one transaction that claims every key and inserts the task, or
//!   nothing (`enqueue`).
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

use oncely_core::{ClaimSpec, Completion, Timestamp};
use tokio_postgres::Row;

use super::error::{corrupt, unavailable};
use super::sql::{NOW, UP};
use super::store::PgStore;
use crate::queue::{headers_from_json, LAPSED_ON_LAST_ATTEMPT};
use crate::watch;
use crate::{
    Claim, Finished, NewTask, Result, StoreError, Task, TaskCounts, TaskError, TaskFence, TaskId,
    TaskOutcome, TaskQueue, TaskState,
};

/// The columns of a task, as [`task_from_row`] reads them by name.
pub(super) const TASK_COLUMNS: &str =
    "id, kind, record, target, method, headers, body, state, attempts, max_attempts, \
     timeout_ms, backoff_ms, next_at, owner, lease_until, last_error, created_at, updated_at";

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

/// A count as an `integer` column, capped.
pub(super) fn i32_of(v: u32) -> i32 {
    v.min(i32::MAX as u32) as i32
}

/// A duration in ms as a `bigint` column, capped.
pub(super) fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// Leases up to `$3` due tasks of kind `$2` to `$4` for `$5` ms (`$6`: the error of a
/// task that lapsed on its last attempt and is dead instead). A running task is due only
/// when its lease lapsed by the database's clock, the server has been up for a whole
/// lease (`UP`), and this process watched the same lease (`$7` ids, `$8` their
/// `lease_until`) unchanged for a whole lease ([`LAPSED_SQL`], `crate::watch`).
static LEASE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH t AS ({NOW}), {UP},
         due AS (
             SELECT k.id FROM tasks k, t, up u
             WHERE k.kind = $2 AND ((k.state = 'pending' AND k.next_at <= t.now)
                OR (k.state = 'running' AND k.lease_until <= t.now
                    AND u.up >= k.lease_until - k.updated_at
                    AND (k.id, k.lease_until) IN
                        (SELECT * FROM unnest($7::text[], $8::bigint[]))))
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
        cols = *TASK_COLUMNS_OF_K
    )
});

/// [`TASK_COLUMNS`] of the table named `k`.
static TASK_COLUMNS_OF_K: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    TASK_COLUMNS
        .split(", ")
        .map(|c| format!("k.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
});

/// The columns of a task's lease, as [`lease_remaining`] reads them.
const LEASE_COLUMNS: &str = "k.id, k.attempts, k.lease_until, k.updated_at";

/// Renews task `$2` of owner `$3` and attempt `$4` for `$5` ms; returns its lease.
static RENEW_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH t AS ({NOW})
         UPDATE tasks k SET lease_until = t.now + $5, updated_at = t.now
         FROM t
         WHERE k.id = $2 AND k.owner = $3 AND k.attempts = $4 AND k.state = 'running'
         RETURNING {LEASE_COLUMNS}"
    )
});

/// The leases of the running tasks of kind `$2` that lapsed by the database's clock: the
/// candidates this process watches before [`LEASE_SQL`] may take one over.
static LAPSED_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH t AS ({NOW})
         SELECT {LEASE_COLUMNS} FROM tasks k, t
         WHERE k.kind = $2 AND k.state = 'running' AND k.lease_until <= t.now
         ORDER BY k.lease_until, k.id
         LIMIT 256"
    )
});

/// A running task's lease read with [`LEASE_COLUMNS`], watched (`crate::watch`): its id,
/// its `lease_until`, and what is left of it as this process observed it at `mono`.
fn lease_remaining(row: &Row, mono: Duration) -> Result<(String, i64, Duration)> {
    let id: String = row.try_get("id").map_err(corrupt)?;
    let attempts: i32 = row.try_get("attempts").map_err(corrupt)?;
    let until: i64 = row.try_get("lease_until").map_err(corrupt)?;
    let renewed: i64 = row.try_get("updated_at").map_err(corrupt)?;
    let left = watch::remaining(
        &id,
        attempts.max(0) as u32,
        Timestamp(until),
        Timestamp(renewed),
        mono,
    );
    Ok((id, until, left))
}

/// The tasks a lease statement returned that it leased (not those it made dead); the
/// watch of each one's lease starts now (`crate::watch`).
fn leased(rows: &[Row], mono: Duration) -> Result<Vec<Task>> {
    let mut tasks = rows.iter().map(task_from_row).collect::<Result<Vec<_>>>()?;
    tasks.retain(|t| t.state == TaskState::Running);
    for t in &tasks {
        watch::task_remaining(t, mono);
    }
    tasks.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(tasks)
}

impl PgStore {
    /// The running tasks of `kind` whose lease this process has watched lapse
    /// (`crate::watch`): their ids and their `lease_until`, as [`LEASE_SQL`] takes them.
    /// A commit that waited (a synchronous standby away) shows a renewal already lapsed
    /// by the database's clock while its worker is alive: the first look here starts
    /// the watch, and the task is taken over only if no renewal shows for a whole lease.
    async fn watched_lapsed(&self, kind: &str) -> Result<(Vec<String>, Vec<i64>)> {
        let rows = self.query(&LAPSED_SQL, &[&self.offset(), &kind]).await?;
        let mono = self.monotonic();
        let mut ids = Vec::new();
        let mut untils = Vec::new();
        for row in &rows {
            let (id, until, left) = lease_remaining(row, mono)?;
            if left.is_zero() {
                ids.push(id);
                untils.push(until);
            }
        }
        Ok((ids, untils))
    }
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
        let (ids, untils) = self.watched_lapsed(kind).await?;
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
                    &ids,
                    &untils,
                ],
            )
            .await?;
        leased(&rows, self.monotonic())
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
        let (ids, untils) = self.watched_lapsed(kind).await?;
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
                    &ids,
                    &untils,
                ],
            )
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        leased(&rows, self.monotonic())
    }

    async fn renew_task(&self, fence: &TaskFence, lease: Duration) -> Result<()> {
        let row = self
            .query_opt(
                &RENEW_SQL,
                &[
                    &self.offset(),
                    &fence.id.0,
                    &fence.owner,
                    &i32_of(fence.attempt),
                    &ms(lease),
                ],
            )
            .await?
            .ok_or_else(|| {
                StoreError::Task(TaskError::Fenced {
                    id: fence.id.clone(),
                    attempt: fence.attempt,
                })
            })?;
        lease_remaining(&row, self.monotonic())?;
        Ok(())
    }

    async fn finish_task(&self, fence: &TaskFence, outcome: TaskOutcome) -> Result<Finished> {
        let attempt = i32_of(fence.attempt);
        let fenced = || {
            StoreError::Task(TaskError::Fenced {
                id: fence.id.clone(),
                attempt: fence.attempt,
            })
        };
        // Its lease ends here, whatever the outcome (forgetting early only restarts the
        // watch at the next look).
        watch::forget(fence.id.as_str());
        let done = match outcome {
            TaskOutcome::Done => {
                let row = self
                    .query_opt(
                        "DELETE FROM tasks WHERE id = $1 AND owner = $2 AND attempts = $3 \
                         AND state = 'running' RETURNING id",
                        &[&fence.id.0, &fence.owner, &attempt],
                    )
                    .await?;
                if row.is_some() {
                    return Ok(Finished::Done);
                }
                // Gone: this delete retried after its answer was lost, or another worker's
                // (the row is deleted by nothing else). Either way the delivery is done;
                // the worker acts on that only once it is durable (`PgStore::durable`).
                self.durable().await?;
                return Err(fenced());
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
