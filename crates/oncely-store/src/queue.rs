//! The durable task queue: work the gateway owes someone, kept in the ledger's database.
//!
//! Webhook deliveries (kind `webhook`) and queued jobs (kind `job`) are tasks. A task is
//! created together with the ledger records that claim its work, in one transaction
//! ([`TaskQueue::claim_with_task`](crate::TaskQueue::claim_with_task)): either every claim is
//! granted (a new key, an expired one, or a released record retried under its id) and the
//! task exists, or nothing was written. Workers then lease due tasks, run them,
//! and finish them, fenced by owner and attempt exactly like records:
//!
//! ```text
//!   enqueue ──► pending ──lease──► running ──finish(Done)──► (row deleted, body gone)
//!                 ▲  ▲               │ │
//!                 │  └─finish(Retry)─┘ └─finish(Dead), or lease lapsed on the last attempt─► dead
//!                 │                  lease lapsed (worker died): leased again, attempt + 1
//!                 └──────────────── requeue (operator: redeliver) ◄──────────────────────── dead
//! ```
//!
//! - **Due**: `pending` with `next_at <= now`, or `running` whose lease lapsed.
//! - **Lease**: `attempts + 1`, the worker's name as owner, `lease_until = now + lease`;
//!   the fence is `(id, owner, attempts)`, so a worker whose lease lapsed and was leased
//!   again cannot finish the task any more ([`TaskError::Fenced`]). The worker renews
//!   its lease while the work runs ([`Task::renew`]), so leases are short and the task of
//!   a worker that died is leased again about one lease later.
//! - **Bodies** live only while needed: a finished (`Done`) task's row is deleted; a dead
//!   task keeps its body so that it can be requeued.
//! - PostgreSQL leases with `FOR UPDATE SKIP LOCKED`, so instances on one database never
//!   lease one task twice at a time; SQLite's single writer does the same per file.
//!
//! The pure rules of every move are here ([`Task::lease`], [`Task::finish`],
//! [`Task::requeue`]); the memory and SQLite backends call them, PostgreSQL mirrors them in
//! conditional SQL, and the conformance suite checks that they agree.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use oncely_core::{RecordId, Timestamp};

/// An opaque task id (`task_...`, time-ordered).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub String);

impl TaskId {
    /// A new time-ordered id.
    pub fn new() -> TaskId {
        TaskId(format!("task_{}", uuid::Uuid::now_v7().simple()))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TaskId {
    fn default() -> TaskId {
        TaskId::new()
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a task is in its life (a finished task is deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Waiting for `next_at`.
    Pending,
    /// Leased by a worker until `lease_until`.
    Running,
    /// Gave up after its last attempt; kept (with its body) until requeued.
    Dead,
}

impl TaskState {
    /// The state's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::Dead => "dead",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskState {
    type Err = String;

    fn from_str(s: &str) -> Result<TaskState, String> {
        match s {
            "pending" => Ok(TaskState::Pending),
            "running" => Ok(TaskState::Running),
            "dead" => Ok(TaskState::Dead),
            other => Err(format!("unknown task state {other:?}")),
        }
    }
}

/// A task to enqueue: an HTTP request the gateway owes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    /// `webhook` or `job`: which workers lease it.
    pub kind: String,
    /// Where to send it.
    pub target: String,
    /// The HTTP method.
    pub method: String,
    /// The headers to send (e.g. `content-type`, `idempotency-key`).
    pub headers: Vec<(String, String)>,
    /// The body to send.
    pub body: Vec<u8>,
    /// Attempts before the task is dead (at least 1).
    pub max_attempts: u32,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// The first retry's delay (the worker doubles it per attempt).
    pub backoff: Duration,
}

/// A queued task, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// Its id.
    pub id: TaskId,
    /// `webhook` or `job`.
    pub kind: String,
    /// The first ledger record claimed with it.
    pub record: Option<RecordId>,
    /// Where to send it.
    pub target: String,
    /// The HTTP method.
    pub method: String,
    /// The headers to send.
    pub headers: Vec<(String, String)>,
    /// The body to send.
    pub body: Vec<u8>,
    /// Where it is.
    pub state: TaskState,
    /// Attempts started so far (the fencing token of the current lease).
    pub attempts: u32,
    /// Attempts before it is dead.
    pub max_attempts: u32,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// The first retry's delay.
    pub backoff: Duration,
    /// When it is due (pending).
    pub next_at: Timestamp,
    /// The worker that leased it (running).
    pub owner: Option<String>,
    /// Until when (running).
    pub lease_until: Option<Timestamp>,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// When it was enqueued.
    pub created_at: Timestamp,
    /// Its last change.
    pub updated_at: Timestamp,
}

/// The proof that a worker holds a task's current lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFence {
    /// The task.
    pub id: TaskId,
    /// The worker that leased it.
    pub owner: String,
    /// The attempt it leased.
    pub attempt: u32,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    /// Done: the task is deleted.
    Done,
    /// Failed; try again at `at` (or, after the last attempt, the task is dead instead).
    Retry {
        /// When to try again.
        at: Timestamp,
        /// Why this attempt failed.
        error: String,
    },
    /// Give up now.
    Dead {
        /// Why.
        error: String,
    },
}

/// What a finish did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// The task is done and deleted.
    Done,
    /// The task waits for its next attempt at this time.
    Retrying(Timestamp),
    /// The task is dead (asked for, or its last attempt failed).
    Dead,
}

/// How many tasks of one kind are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Waiting (due or not).
    pub pending: u64,
    /// Leased now.
    pub running: u64,
    /// Dead-lettered.
    pub dead: u64,
}

/// Why a queue move was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// No task has this id (finished tasks are deleted).
    #[error("no queued task {0}")]
    NotFound(TaskId),
    /// The worker's lease is gone (it lapsed and another worker leased the task, or the
    /// task was finished).
    #[error("task {id} is no longer leased by this worker at attempt {attempt}")]
    Fenced {
        /// The task.
        id: TaskId,
        /// The attempt the worker held.
        attempt: u32,
    },
    /// The move does not apply to the task's state (e.g. requeueing a pending task).
    #[error("task {id} is {state}, cannot {action}")]
    WrongState {
        /// The task.
        id: TaskId,
        /// Its state.
        state: TaskState,
        /// The refused move.
        action: &'static str,
    },
}

/// The error text a task gets when its last attempt's lease lapsed.
pub const LAPSED_ON_LAST_ATTEMPT: &str =
    "the worker's lease lapsed on the last attempt (it stopped or hung)";

impl Task {
    /// A new pending task, due now.
    pub fn new(id: TaskId, record: Option<RecordId>, new: NewTask, now: Timestamp) -> Task {
        Task {
            id,
            kind: new.kind,
            record,
            target: new.target,
            method: new.method,
            headers: new.headers,
            body: new.body,
            state: TaskState::Pending,
            attempts: 0,
            max_attempts: new.max_attempts.max(1),
            timeout: new.timeout,
            backoff: new.backoff,
            next_at: now,
            owner: None,
            lease_until: None,
            last_error: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// The fence of the current lease (running tasks only).
    pub fn fence(&self) -> Option<TaskFence> {
        (self.state == TaskState::Running).then(|| TaskFence {
            id: self.id.clone(),
            owner: self.owner.clone().unwrap_or_default(),
            attempt: self.attempts,
        })
    }

    /// A header's value (first match, case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// When it is (or was) due: `next_at` while pending, the lease's end while running.
    pub fn due_at(&self) -> Timestamp {
        match self.state {
            TaskState::Running => self.lease_until.unwrap_or(self.next_at),
            _ => self.next_at,
        }
    }

    /// Whether a worker may lease it now.
    pub fn is_due(&self, now: Timestamp) -> bool {
        match self.state {
            TaskState::Pending => self.next_at <= now,
            TaskState::Running => self.lease_until.is_none_or(|until| until <= now),
            TaskState::Dead => false,
        }
    }

    /// Leases a due task to `owner`. Returns `false` (and changes nothing but the state)
    /// when a lapsed lease was the last attempt: the task is dead instead.
    pub fn lease(&mut self, owner: &str, lease: Duration, now: Timestamp) -> bool {
        if self.state == TaskState::Running && self.attempts >= self.max_attempts {
            self.state = TaskState::Dead;
            self.owner = None;
            self.lease_until = None;
            self.last_error = Some(LAPSED_ON_LAST_ATTEMPT.into());
            self.updated_at = now;
            return false;
        }
        self.state = TaskState::Running;
        self.attempts += 1;
        self.owner = Some(owner.to_string());
        self.lease_until = Some(now.plus(lease));
        self.updated_at = now;
        true
    }

    /// Checks that `fence` holds the current lease.
    pub fn check_fence(&self, fence: &TaskFence) -> Result<(), TaskError> {
        if self.state != TaskState::Running
            || self.attempts != fence.attempt
            || self.owner.as_deref() != Some(fence.owner.as_str())
        {
            return Err(TaskError::Fenced {
                id: self.id.clone(),
                attempt: fence.attempt,
            });
        }
        Ok(())
    }

    /// The leaseholder extends its lease while the work runs (like a record's owner), so
    /// that a lease can be short and a dead worker's task is leased again soon.
    pub fn renew(
        &mut self,
        fence: &TaskFence,
        lease: Duration,
        now: Timestamp,
    ) -> Result<(), TaskError> {
        self.check_fence(fence)?;
        self.lease_until = Some(now.plus(lease));
        self.updated_at = now;
        Ok(())
    }

    /// Ends the current attempt. `Done` leaves the task as it was (the store deletes it).
    pub fn finish(
        &mut self,
        fence: &TaskFence,
        outcome: TaskOutcome,
        now: Timestamp,
    ) -> Result<Finished, TaskError> {
        self.check_fence(fence)?;
        self.owner = None;
        self.lease_until = None;
        self.updated_at = now;
        Ok(match outcome {
            TaskOutcome::Done => Finished::Done,
            TaskOutcome::Retry { at, error } if self.attempts < self.max_attempts => {
                self.state = TaskState::Pending;
                self.next_at = at;
                self.last_error = Some(error);
                Finished::Retrying(at)
            }
            TaskOutcome::Retry { error, .. } | TaskOutcome::Dead { error } => {
                self.state = TaskState::Dead;
                self.last_error = Some(error);
                Finished::Dead
            }
        })
    }

    /// Dead → pending, due now, attempts reset (an operator's redeliver).
    pub fn requeue(&mut self, now: Timestamp) -> Result<(), TaskError> {
        if self.state != TaskState::Dead {
            return Err(TaskError::WrongState {
                id: self.id.clone(),
                state: self.state,
                action: "requeue",
            });
        }
        self.state = TaskState::Pending;
        self.attempts = 0;
        self.next_at = now;
        self.updated_at = now;
        Ok(())
    }
}

/// Runs `work` while keeping the task's lease alive ([`crate::lease::keep`]: every third
/// of `lease`, sooner after a renewal the store could not take) until `work` ends. A
/// refused renewal (the task was leased again, so this worker was taken for dead) is
/// logged and the work runs on: what it records is fenced by the record and the task.
pub async fn while_leased<F: std::future::Future>(
    store: &dyn crate::Store,
    fence: &TaskFence,
    lease: Duration,
    work: F,
) -> F::Output {
    let keeper = crate::lease::keep(
        lease,
        || store.renew_task(fence, lease),
        |e, pause| {
            tracing::warn!(task = %fence.id, attempt = fence.attempt, error = %e,
                retry_in_ms = pause.as_millis() as u64, "task lease renewal failed; retrying");
        },
    );
    tokio::pin!(work);
    tokio::select! {
        out = &mut work => out,
        refused = keeper => {
            tracing::warn!(task = %fence.id, attempt = fence.attempt, error = %refused,
                "task lease renewal refused: the work runs on, fenced");
            work.await
        }
    }
}

/// Encodes headers for storage (a JSON array of pairs), as the backends keep them.
pub fn headers_to_json(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).expect("headers serialise")
}

/// Decodes headers stored by [`headers_to_json`].
pub fn headers_from_json(text: &str) -> Result<Vec<(String, String)>, String> {
    serde_json::from_str(text).map_err(|e| format!("task headers: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> Task {
        Task::new(
            TaskId::new(),
            None,
            NewTask {
                kind: "webhook".into(),
                target: "http://127.0.0.1:1/".into(),
                method: "POST".into(),
                headers: vec![("Idempotency-Key".into(), "evt_1".into())],
                body: b"{}".to_vec(),
                max_attempts: 2,
                timeout: Duration::from_secs(1),
                backoff: Duration::from_millis(10),
            },
            Timestamp(1_000),
        )
    }

    #[test]
    fn lease_finish_retry_then_dead() {
        let mut t = task();
        assert!(t.is_due(Timestamp(1_000)));
        assert_eq!(t.header("idempotency-key"), Some("evt_1"));
        assert!(t.lease("w1", Duration::from_secs(5), Timestamp(1_000)));
        let fence = t.fence().unwrap();
        assert_eq!(fence.attempt, 1);
        assert!(!t.is_due(Timestamp(2_000)));
        let retry = TaskOutcome::Retry {
            at: Timestamp(3_000),
            error: "500".into(),
        };
        assert_eq!(
            t.finish(&fence, retry.clone(), Timestamp(2_000)),
            Ok(Finished::Retrying(Timestamp(3_000)))
        );
        assert!(!t.is_due(Timestamp(2_999)));
        assert!(t.lease("w2", Duration::from_secs(5), Timestamp(3_000)));
        let stale = fence;
        assert!(matches!(
            t.finish(&stale, TaskOutcome::Done, Timestamp(3_001)),
            Err(TaskError::Fenced { .. })
        ));
        let fence = t.fence().unwrap();
        assert_eq!(
            t.finish(&fence, retry, Timestamp(3_100)),
            Ok(Finished::Dead)
        );
        assert_eq!(t.state, TaskState::Dead);
        t.requeue(Timestamp(4_000)).unwrap();
        assert_eq!((t.state, t.attempts), (TaskState::Pending, 0));
        assert!(t.requeue(Timestamp(4_000)).is_err());
    }

    #[test]
    fn a_lapsed_last_attempt_is_dead() {
        let mut t = task();
        t.max_attempts = 1;
        assert!(t.lease("w1", Duration::from_secs(1), Timestamp(1_000)));
        assert!(t.is_due(Timestamp(2_000)));
        assert!(!t.lease("w2", Duration::from_secs(1), Timestamp(2_000)));
        assert_eq!(t.state, TaskState::Dead);
        assert_eq!(t.last_error.as_deref(), Some(LAPSED_ON_LAST_ATTEMPT));
    }
}
