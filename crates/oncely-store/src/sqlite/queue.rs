//! The task queue on SQLite (table `tasks`, migration 2).
//!
//! Every write runs in the writer thread, so a claim-with-task and a lease are each one
//! read-decide-write that no other writer of the file interleaves with (`BEGIN IMMEDIATE`
//! orders processes). A claim-with-task writes several rows, so it runs under a
//! `SAVEPOINT` and rolls back to it on any error, leaving the rest of the group intact.
//! The moves themselves are the pure ones of [`crate::queue`]; whether a running task's
//! lease lapsed is decided on the monotonic clock ([`crate::watch`]).

use async_trait::async_trait;
use std::time::Duration;

use oncely_core::{ClaimSpec, Completion, Timestamp};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::error::sql_error;
use super::{rows, SqliteStore};
use crate::plan::plan_claims;
use crate::queue::{headers_from_json, headers_to_json};
use crate::watch;
use crate::{
    Claim, Finished, NewTask, Result, StoreError, Task, TaskCounts, TaskError, TaskFence, TaskId,
    TaskOutcome, TaskQueue, TaskState,
};

const COLUMNS: &str = "id, kind, record, target, method, headers, body, state, attempts, \
                       max_attempts, timeout_ms, backoff_ms, next_at, owner, lease_until, \
                       last_error, created_at, updated_at";

fn from_row(row: &Row<'_>) -> rusqlite::Result<Task> {
    let bad = |i: usize, what: String| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, what.into())
    };
    let headers: String = row.get(5)?;
    let state: String = row.get(7)?;
    Ok(Task {
        id: TaskId(row.get(0)?),
        kind: row.get(1)?,
        record: row.get::<_, Option<String>>(2)?.map(oncely_core::RecordId),
        target: row.get(3)?,
        method: row.get(4)?,
        headers: headers_from_json(&headers).map_err(|e| bad(5, e))?,
        body: row.get::<_, Option<Vec<u8>>>(6)?.unwrap_or_default(),
        state: state.parse().map_err(|e| bad(7, e))?,
        attempts: row.get(8)?,
        max_attempts: row.get(9)?,
        timeout: Duration::from_millis(row.get::<_, i64>(10)?.max(0) as u64),
        backoff: Duration::from_millis(row.get::<_, i64>(11)?.max(0) as u64),
        next_at: Timestamp(row.get(12)?),
        owner: row.get(13)?,
        lease_until: row.get::<_, Option<i64>>(14)?.map(Timestamp),
        last_error: row.get(15)?,
        created_at: Timestamp(row.get(16)?),
        updated_at: Timestamp(row.get(17)?),
    })
}

fn by_id(conn: &Connection, id: &TaskId) -> Result<Option<Task>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tasks WHERE id = ?1"))
        .and_then(|mut st| st.query_row([&id.0], from_row).optional())
        .map_err(sql_error)
}

fn insert(conn: &Connection, t: &Task) -> Result<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO tasks ({COLUMNS}) VALUES \
         (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"
    ))
    .and_then(|mut st| {
        st.execute(params![
            t.id.0,
            t.kind,
            t.record.as_ref().map(|r| r.0.clone()),
            t.target,
            t.method,
            headers_to_json(&t.headers),
            t.body,
            t.state.as_str(),
            t.attempts,
            t.max_attempts,
            t.timeout.as_millis() as i64,
            t.backoff.as_millis() as i64,
            t.next_at.0,
            t.owner,
            t.lease_until.map(|l| l.0),
            t.last_error,
            t.created_at.0,
            t.updated_at.0,
        ])
    })
    .map_err(sql_error)?;
    Ok(())
}

/// Writes the mutable columns of `t` back.
fn update(conn: &Connection, t: &Task) -> Result<()> {
    conn.prepare_cached(
        "UPDATE tasks SET state = ?2, attempts = ?3, next_at = ?4, owner = ?5, \
         lease_until = ?6, last_error = ?7, updated_at = ?8 WHERE id = ?1",
    )
    .and_then(|mut st| {
        st.execute(params![
            t.id.0,
            t.state.as_str(),
            t.attempts,
            t.next_at.0,
            t.owner,
            t.lease_until.map(|l| l.0),
            t.last_error,
            t.updated_at.0,
        ])
    })
    .map_err(sql_error)?;
    Ok(())
}

/// Runs `work` under a savepoint: all of it, or none of it.
fn atomically<T>(conn: &Connection, work: impl FnOnce() -> Result<T>) -> Result<T> {
    conn.execute_batch("SAVEPOINT oncely_queue")
        .map_err(sql_error)?;
    match work() {
        Ok(v) => {
            conn.execute_batch("RELEASE oncely_queue")
                .map_err(sql_error)?;
            Ok(v)
        }
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK TO oncely_queue; RELEASE oncely_queue");
            }
            Err(e)
        }
    }
}

/// The running tasks of `kind`, each with what is left of its lease as this process
/// observes it on the monotonic clock `mono` ([`crate::watch`]). Their records' leases
/// are watched from now on too, so that a dead worker's record lapses with its task.
fn running(conn: &Connection, kind: &str, mono: Duration) -> Result<Vec<(Task, Duration)>> {
    let tasks: Vec<Task> = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM tasks WHERE kind = ?1 AND state = 'running'"
        ))
        .and_then(|mut st| {
            st.query_map([kind], from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql_error)?;
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Some(record) = &t.record {
            if let Some(r) = rows::by_id(conn, record)? {
                watch::record_remaining(&r, mono);
            }
        }
        let left = watch::task_remaining(&t, mono);
        out.push((t, left));
    }
    Ok(out)
}

/// Leases up to `max` due tasks of `kind` to `owner`, oldest due first: pending ones
/// whose `next_at` came, and running ones whose lease lapsed by this process's
/// observation.
fn lease_due(
    conn: &Connection,
    kind: &str,
    owner: &str,
    max: usize,
    lease: Duration,
    now: Timestamp,
    mono: Duration,
) -> Result<Vec<Task>> {
    let mut due: Vec<Task> = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM tasks WHERE kind = ?1 AND state = 'pending' \
             AND next_at <= ?2 ORDER BY next_at, id LIMIT ?3"
        ))
        .and_then(|mut st| {
            st.query_map(params![kind, now.0, max as i64], from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql_error)?;
    due.extend(
        running(conn, kind, mono)?
            .into_iter()
            .filter(|(_, left)| left.is_zero())
            .map(|(t, _)| t),
    );
    due.sort_by(|a, b| (a.due_at(), &a.id).cmp(&(b.due_at(), &b.id)));
    due.truncate(max);
    let mut leased = Vec::with_capacity(due.len());
    for mut t in due {
        let ok = t.lease(owner, lease, now);
        update(conn, &t)?;
        if ok {
            watch::task_remaining(&t, mono);
            leased.push(t);
        }
    }
    Ok(leased)
}

#[async_trait]
impl TaskQueue for SqliteStore {
    async fn claim_with_task(
        &self,
        specs: &[ClaimSpec],
        completion: Option<Completion>,
        task: NewTask,
    ) -> Result<Claim> {
        let specs = specs.to_vec();
        let clock = self.clock.clone();
        self.writer
            .run(move |conn, now| {
                atomically(conn, || {
                    let plan = plan_claims(&specs, completion, now, |scope, key| {
                        rows::by_key(conn, scope, key)
                    })?;
                    let records = match plan {
                        Ok(records) => records,
                        Err(existing) => return Ok((Claim::Existing(existing), None)),
                    };
                    for (old, record) in &records {
                        if let Some(old) = old {
                            super::usage::fold_record(conn, &old.0)?;
                            conn.prepare_cached("DELETE FROM records WHERE id = ?1")
                                .and_then(|mut st| st.execute([&old.0]))
                                .map_err(sql_error)?;
                            if *old == record.id {
                                // Reclaimed: its stale task goes (see plan_claims).
                                conn.prepare_cached(
                                    "DELETE FROM tasks WHERE record = ?1 AND kind = ?2",
                                )
                                .and_then(|mut st| st.execute(params![old.0, task.kind]))
                                .map_err(sql_error)?;
                            }
                        }
                        rows::insert(conn, record)?;
                        watch::record_remaining(record, clock.monotonic());
                    }
                    let first = records[0].1.clone();
                    let task = Task::new(TaskId::new(), Some(first.id.clone()), task, now);
                    insert(conn, &task)?;
                    Ok((Claim::Owned(first), None))
                })
            })
            .await
    }

    async fn lease_tasks(
        &self,
        kind: &str,
        owner: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        let (kind, owner) = (kind.to_string(), owner.to_string());
        let clock = self.clock.clone();
        self.writer
            .run(move |conn, now| {
                let mono = clock.monotonic();
                Ok((lease_due(conn, &kind, &owner, max, lease, now, mono)?, None))
            })
            .await
    }

    /// The count and the lease run in one writer turn, so no other lease (of this
    /// process, or of another one: `BEGIN IMMEDIATE`) comes between them.
    async fn lease_tasks_capped(
        &self,
        kind: &str,
        owner: &str,
        max_running: usize,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        let (kind, owner) = (kind.to_string(), owner.to_string());
        let clock = self.clock.clone();
        self.writer
            .run(move |conn, now| {
                let mono = clock.monotonic();
                let live = running(conn, &kind, mono)?
                    .iter()
                    .filter(|(_, left)| !left.is_zero())
                    .count();
                let free = max_running.saturating_sub(live);
                if free == 0 {
                    return Ok((Vec::new(), None));
                }
                Ok((
                    lease_due(conn, &kind, &owner, free, lease, now, mono)?,
                    None,
                ))
            })
            .await
    }

    async fn renew_task(&self, fence: &TaskFence, lease: Duration) -> Result<()> {
        let fence = fence.clone();
        let clock = self.clock.clone();
        self.writer
            .run(move |conn, now| {
                let mut t = by_id(conn, &fence.id)?.ok_or_else(|| TaskError::Fenced {
                    id: fence.id.clone(),
                    attempt: fence.attempt,
                })?;
                t.renew(&fence, lease, now)?;
                update(conn, &t)?;
                watch::task_remaining(&t, clock.monotonic());
                Ok(((), None))
            })
            .await
    }

    async fn finish_task(&self, fence: &TaskFence, outcome: TaskOutcome) -> Result<Finished> {
        let fence = fence.clone();
        self.writer
            .run(move |conn, now| {
                let mut t = by_id(conn, &fence.id)?.ok_or_else(|| TaskError::Fenced {
                    id: fence.id.clone(),
                    attempt: fence.attempt,
                })?;
                let finished = t.finish(&fence, outcome, now)?;
                watch::forget(t.id.as_str());
                if finished == Finished::Done {
                    conn.prepare_cached("DELETE FROM tasks WHERE id = ?1")
                        .and_then(|mut st| st.execute([&t.id.0]))
                        .map_err(sql_error)?;
                } else {
                    update(conn, &t)?;
                }
                Ok((finished, None))
            })
            .await
    }

    async fn get_task(&self, id: &TaskId) -> Result<Option<Task>> {
        let id = id.clone();
        self.read(move |conn| by_id(conn, &id)).await
    }

    async fn list_tasks(&self, kind: &str, state: Option<TaskState>) -> Result<Vec<Task>> {
        let kind = kind.to_string();
        self.read(move |conn| {
            let state: Value = match state {
                Some(s) => Value::Text(s.as_str().into()),
                None => Value::Null,
            };
            conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM tasks WHERE kind = ?1 AND (?2 IS NULL OR state = ?2) \
                 ORDER BY created_at, id"
            ))
            .and_then(|mut st| {
                st.query_map(params![kind, state], from_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(sql_error)
        })
        .await
    }

    async fn requeue_task(&self, id: &TaskId) -> Result<Task> {
        let id = id.clone();
        self.writer
            .run(move |conn, now| {
                let mut t = by_id(conn, &id)?.ok_or_else(|| TaskError::NotFound(id.clone()))?;
                t.requeue(now)?;
                update(conn, &t)?;
                Ok((t, None))
            })
            .await
    }

    async fn task_counts(&self, kind: &str) -> Result<TaskCounts> {
        let kind = kind.to_string();
        self.read(move |conn| {
            let mut counts = TaskCounts::default();
            let rows: Vec<(String, i64)> = conn
                .prepare_cached("SELECT state, count(*) FROM tasks WHERE kind = ?1 GROUP BY state")
                .and_then(|mut st| {
                    st.query_map([&kind], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(sql_error)?;
            for (state, n) in rows {
                let n = n.max(0) as u64;
                match state.parse::<TaskState>().map_err(StoreError::Corrupt)? {
                    TaskState::Pending => counts.pending = n,
                    TaskState::Running => counts.running = n,
                    TaskState::Dead => counts.dead = n,
                }
            }
            Ok(counts)
        })
        .await
    }
}
