//! The oncely ledger: the [`Store`] traits and their backends.
//!
//! [`Store`] is the umbrella of four small traits, one per concern: [`Ledger`] (the
//! transitions of one record), [`Waiting`] (wake-ups), [`TaskQueue`] (the durable queue)
//! and [`Admin`] (listing, purging, usage, secrets, reconciliation schedules). A backend
//! implements the four; a caller or a fake that needs less uses only the ones it needs.
//!
//! - `sqlite` (feature `sqlite`): the embedded default (`sqlite://oncely.db`): one writer
//!   thread that commits in groups, read connections for lookups, in-process wake-ups.
//! - `postgres` (feature `postgres`): for several gateway instances on one database
//!   (`postgres://...`): `INSERT ... ON CONFLICT DO NOTHING` claims, LISTEN/NOTIFY
//!   wake-ups, the database's clock.
//! - `memory`: for unit tests only (always compiled).
//!
//! Each driver is a cargo feature (`sqlite`, `postgres`; both on by default), so a crate
//! that embeds the ledger compiles only the database driver it uses; [`open`] names the
//! missing feature for a URL whose driver is not compiled in.
//!
//! Every backend passes the same conformance suite (the test-support crate
//! `oncely-store-conformance`, one section per small trait). The rules of every transition
//! live in `oncely_core::record`; a backend only makes them atomic and durable.
//! A guarded request costs one store round trip for a replay ([`Ledger::claim`] returns the
//! completed record) and two for a fresh execution ([`Ledger::claim`], then
//! [`Ledger::complete`] or [`Ledger::release`]). The tables are built for that path: one
//! unique index of 16-byte claim hashes (`oncely_core::Scope::claim_hash`), time-ordered
//! ids (UUIDv7), two more indexes only (records not completed, the expiry); each
//! backend's schema module says the rest.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use oncely_core::{
    ClaimSpec, Completion, Fence, Record, RecordId, Resolution, Scope, State, Timestamp,
    TransitionError,
};

mod backend;
mod bounded;
pub mod churn;
pub mod clock;
pub mod lease;
pub mod memory;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod migration;
mod options;
mod plan;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod queue;
mod replays;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod usage;
mod waiters;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod watch;

pub use backend::open;
pub use bounded::{unanswered, Bounded, ANSWER_WITHIN};
pub use churn::{Churn, ChurnEntry, ChurnFilter, ChurnKind};
pub use clock::{Clock, ManualClock, SystemClock};
pub use options::{redact_url, StoreOptions};
pub use queue::{
    Finished, NewTask, Task, TaskCounts, TaskError, TaskFence, TaskId, TaskOutcome, TaskState,
};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database cannot be reached or refused the operation for a reason of its own
    /// (connection lost, disk full, locked). Guarded requests must not be forwarded.
    #[error("the ledger is unavailable: {0}")]
    Unavailable(String),
    /// The transition was refused by the record's rules (stale owner, wrong state).
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// No record has this id.
    #[error("no ledger record {0}")]
    NotFound(RecordId),
    /// The store URL or options are wrong.
    #[error("{0}")]
    Config(String),
    /// Stored data could not be read back.
    #[error("the ledger holds unreadable data: {0}")]
    Corrupt(String),
    /// A queue move was refused (stale leaseholder, wrong state, no such task).
    #[error(transparent)]
    Task(#[from] TaskError),
}

/// A store result.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The claimant owns the record now (new, reclaimed after a release, or renewed after
    /// expiry) and must execute it, then complete or release it.
    Owned(Record),
    /// Another claim holds `(scope, key)`: the caller replays, waits, or refuses.
    Existing(Record),
}

impl Claim {
    /// The record, whoever owns it.
    pub fn record(&self) -> &Record {
        match self {
            Claim::Owned(r) | Claim::Existing(r) => r,
        }
    }
}

/// What a take-over of a lapsed lease did.
pub use oncely_core::TakeOverOutcome;

/// Filters for [`Admin::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only records in this state.
    pub state: Option<State>,
    /// Only this principal (its keyed hash).
    pub principal: Option<String>,
    /// Only this route.
    pub route: Option<String>,
    /// At most this many (newest first).
    pub limit: Option<usize>,
}

/// Billing counters of one principal (or the totals).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageRow {
    /// The principal's keyed hash (empty for totals).
    pub principal: String,
    /// Completed executions.
    pub fresh: u64,
    /// Units they were charged.
    pub fresh_units: u64,
    /// Repeats answered from the ledger instead of executing.
    pub repeats: u64,
    /// Units those repeats were not charged.
    pub repeat_units: u64,
}

/// One hour of one principal's use of one route: a row of the usage history (what
/// records that left the ledger counted, folded when they left), or that with what the
/// records still in the ledger add to it. A row per principal, route and hour at most.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageHour {
    /// The principal's keyed hash.
    pub principal: String,
    /// The route (`METHOD /path`, or the MCP tool's route).
    pub route: String,
    /// The start of the hour (UTC).
    pub hour: Timestamp,
    /// Executions completed in the hour.
    pub fresh: u64,
    /// Units they were charged.
    pub fresh_units: u64,
    /// Repeats answered in the hour without executing.
    pub repeats: u64,
    /// Units those repeats were not charged.
    pub repeat_units: u64,
    /// Of the repeats, those that waited for a running original.
    pub joined: u64,
    /// Of the repeats, those that came after the original finished.
    pub replayed: u64,
}

/// The start of the hour that holds `t`: usage is kept, and periods are counted, by the
/// hour (a period asked from `t` starts at `hour_of(t)`).
pub fn hour_of(t: Timestamp) -> Timestamp {
    Timestamp(t.0.div_euclid(HOUR_MS).saturating_mul(HOUR_MS))
}

const HOUR_MS: i64 = 3_600_000;

/// Usage per principal, with totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Sum over every principal.
    pub totals: UsageRow,
    /// One row per principal, most charged first.
    pub by_principal: Vec<UsageRow>,
}

/// How a repeat was answered without executing again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RepeatKind {
    /// It waited for the running original and got its answer.
    Joined,
    /// It came after the original finished and got the stored answer.
    Replayed,
}

impl RepeatKind {
    /// `joined` or `replayed`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            RepeatKind::Joined => "joined",
            RepeatKind::Replayed => "replayed",
        }
    }

    /// Parses [`RepeatKind::as_str`].
    pub fn parse(text: &str) -> Option<RepeatKind> {
        match text {
            "joined" => Some(RepeatKind::Joined),
            "replayed" => Some(RepeatKind::Replayed),
            _ => None,
        }
    }
}

/// Repeats of a record, as the guard counted them: one (`count` 1), or several of one
/// kind that waited in memory past its limit while the ledger was away, summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeat {
    /// When it was answered (the first of them).
    pub at: Timestamp,
    /// Joined or replayed.
    pub kind: RepeatKind,
    /// How many repeats (1 unless summed).
    pub count: u64,
    /// The units they were not charged, together.
    pub units: u64,
}

/// One repeat listed for a statement: the [`Repeat`] and the record it repeated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepeatEvent {
    /// The record answered.
    pub record: RecordId,
    /// The record's route.
    pub route: String,
    /// When it was answered.
    pub at: Timestamp,
    /// Joined or replayed.
    pub kind: RepeatKind,
    /// How many repeats the line is (1 unless summed, see [`Repeat`]).
    pub count: u64,
    /// The units it was not charged.
    pub units: u64,
}

/// The repeats of one principal in a period: those whose records are still in the ledger
/// one by one (the first ones listed), the older ones summed per route and hour, and the
/// totals over both, exact (read at one moment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepeatEvents {
    /// The oldest repeats first, at most the limit asked for.
    pub listed: Vec<RepeatEvent>,
    /// Repeats whose records have left the ledger, per route and hour (oldest first;
    /// only hours with repeats).
    pub older: Vec<UsageHour>,
    /// How many repeats in the period (listed, unlisted or older).
    pub total: u64,
    /// Their units.
    pub total_units: u64,
}

/// Where the server's own reconciliation of one `outcome_unknown` record stands: kept in
/// the ledger, so that a restarted server continues it and every instance on the
/// database shares it. It belongs to one stay in `outcome_unknown` (the record's
/// `updated_at` when it got there): a record that leaves the state and comes back
/// starts afresh, at [`ReconcileSchedule::default`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconcileSchedule {
    /// Attempts begun so far.
    pub attempts: u32,
    /// When the next attempt is due (`None`: not set yet, the route's
    /// `reconcile_after` from `updated_at` applies).
    pub next_at: Option<Timestamp>,
}

/// The whole ledger: every small trait. A backend implements [`Ledger`], [`Waiting`],
/// [`TaskQueue`] and [`Admin`] and is a `Store` through the blanket impl; a caller that
/// needs less takes `Arc<dyn Ledger>` (an `Arc<dyn Store>` upcasts to it). Every method is
/// one round trip to the database, and every state change follows `oncely_core::record`.
pub trait Store: Ledger + Waiting + TaskQueue + Admin {}

impl<T: Ledger + Waiting + TaskQueue + Admin + ?Sized> Store for T {}

/// The transitions of one record and its reads: claim, complete, release, take over,
/// resolve, count repeats.
#[async_trait]
pub trait Ledger: Send + Sync + fmt::Debug + 'static {
    /// Atomically claims `(spec.scope, spec.key)`: inserts a processing record owned by
    /// `spec.owner` when none exists (or reuses a released row with the same fingerprint,
    /// or an expired completed one), else returns the existing record unchanged. Never
    /// check-then-insert.
    async fn claim(&self, spec: &ClaimSpec) -> Result<Claim>;

    /// The owner stores its answer (processing → completed), fenced by owner and attempt.
    /// This, `release` and `mark_unknown` retried by their owner after the answer was lost
    /// although the write was made (`Record::applied`) answer the record as written; on
    /// PostgreSQL only once that write is durable (it may be on a restarted primary alone).
    async fn complete(&self, fence: &Fence, completion: Completion) -> Result<Record>;

    /// The owner gives up harmlessly (processing → released), fenced. The released
    /// record expires after `window` (the route's), like a completed one.
    async fn release(
        &self,
        fence: &Fence,
        error: Option<String>,
        window: Duration,
    ) -> Result<Record>;

    /// The owner cannot know whether its action happened (→ outcome_unknown), fenced.
    async fn mark_unknown(&self, fence: &Fence, error: String) -> Result<Record>;

    /// The owner extends its lease while its call runs, fenced.
    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<()>;

    /// Takes over a processing record whose lease lapsed, if its attempt is still
    /// `expected_attempt`: a write or job gets a new owner and attempt + 1, an action
    /// becomes outcome_unknown.
    async fn take_over(
        &self,
        id: &RecordId,
        expected_attempt: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<TakeOverOutcome>;

    /// One record by id.
    async fn get(&self, id: &RecordId) -> Result<Option<Record>>;

    /// The record holding `(scope, key)`, if any.
    async fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<Record>>;

    /// Reconciliation: outcome_unknown → completed or released.
    async fn resolve(&self, id: &RecordId, resolution: Resolution) -> Result<Record>;

    /// Counts `repeats` of the record (of `principal` on `route`) on it and keeps each
    /// (time, kind, count, units) for statements and usage, in one write. The events
    /// leave with the record's window ([`Admin::purge_expired`]), folded into the usage
    /// history. Repeats of a record that already left (purged before they were written)
    /// are kept all the same, to be folded at the next purge: none is lost.
    async fn record_repeats(
        &self,
        id: &RecordId,
        principal: &str,
        route: &str,
        repeats: &[Repeat],
    ) -> Result<()>;

    /// The store's clock (the database's, for PostgreSQL).
    async fn now(&self) -> Result<Timestamp>;

    /// What this instance knows of the churn table (module [`churn`]); `None` for a store
    /// that keeps none, whose claims of made-up keys are plain claims.
    fn churn_filter(&self) -> Option<&ChurnFilter> {
        None
    }

    /// The churn entry of `hash`, if any (module [`churn`]).
    async fn churn_get(&self, hash: &[u8; 16]) -> Result<Option<ChurnEntry>> {
        let _ = hash;
        Ok(None)
    }

    /// Writes `entry` unless one holds its hash already (answers whether it did), and
    /// tells every instance's filter of it.
    async fn churn_put(&self, entry: &ChurnEntry) -> Result<bool> {
        let _ = entry;
        Ok(false)
    }

    /// Deletes the undelivered entry of `id`: an answer of it reached a caller.
    async fn churn_forget(&self, id: &RecordId) -> Result<()> {
        let _ = id;
        Ok(())
    }

    /// Every churn entry of `id` (the keys that joined it, whether it is undelivered),
    /// oldest first.
    async fn churn_of(&self, id: &RecordId) -> Result<Vec<ChurnEntry>> {
        let _ = id;
        Ok(Vec::new())
    }

    /// Answers when the database does (health checks).
    async fn ping(&self) -> Result<()>;
}

/// Waiting for a record to leave `processing`, woken by any instance on the database.
#[async_trait]
pub trait Waiting: Send + Sync + fmt::Debug + 'static {
    /// Waits until the record leaves `processing` or `timeout` passes, then returns it as
    /// it is. Wakes as soon as any instance on the same database writes it; no polling
    /// within an instance.
    async fn wait_for(&self, id: &RecordId, timeout: Duration) -> Result<Record>;
}

/// The durable task queue (module `queue`): claims that enqueue work, leases, fenced
/// finishes.
#[async_trait]
pub trait TaskQueue: Send + Sync + fmt::Debug + 'static {
    /// Claims every spec and enqueues `task`, in one transaction, only if every claim is
    /// granted as [`Ledger::claim`] would grant it (no row; an expired completed one,
    /// replaced by a new record; or a released one with the same fingerprint, reclaimed
    /// under its id with attempt + 1): then the records exist (completed with
    /// `completion` when given, else processing and owned by their spec's owner), the task
    /// is pending and due now with `record` = the first spec's record, and the answer is
    /// [`Claim::Owned`] of that record. Otherwise nothing is written and the answer is
    /// [`Claim::Existing`] of the first spec's existing record (or of the first one found).
    /// `specs` must not be empty.
    async fn claim_with_task(
        &self,
        specs: &[ClaimSpec],
        completion: Option<Completion>,
        task: NewTask,
    ) -> Result<Claim>;

    /// Leases up to `max` due tasks of `kind` to `owner` for `lease` (oldest due first):
    /// pending ones whose `next_at` has come, and running ones whose lease lapsed (their
    /// worker stopped). Each gets `attempts + 1`. A lapsed task that was on its last
    /// attempt becomes dead instead. Never gives one task to two callers at a time.
    async fn lease_tasks(
        &self,
        kind: &str,
        owner: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Task>>;

    /// Like [`TaskQueue::lease_tasks`], under a cap that every instance on the database
    /// shares: leases due tasks of `kind` only while fewer than `max_running` of them are
    /// running under a live lease, counting and leasing in one atomic step, so workers
    /// leasing at once on several instances never exceed the cap together. (A job
    /// route's `concurrency`.)
    async fn lease_tasks_capped(
        &self,
        kind: &str,
        owner: &str,
        max_running: usize,
        lease: Duration,
    ) -> Result<Vec<Task>>;

    /// The leaseholder extends its lease on a running task to `now + lease`, fenced by
    /// owner and attempt (refused with [`TaskError::Fenced`] once the task was leased
    /// again or finished). Workers renew every third of the lease while the work runs.
    async fn renew_task(&self, fence: &TaskFence, lease: Duration) -> Result<()> {
        let _ = (fence, lease);
        Err(StoreError::Unavailable(
            "this store cannot renew task leases".into(),
        ))
    }

    /// Ends the leased attempt, fenced by owner and attempt: done (the row and its body
    /// are deleted), retry at a time (dead when it was the last attempt), or dead.
    async fn finish_task(&self, fence: &TaskFence, outcome: TaskOutcome) -> Result<Finished>;

    /// One task by id.
    async fn get_task(&self, id: &TaskId) -> Result<Option<Task>>;

    /// Tasks of `kind` (in `state` when given), oldest first.
    async fn list_tasks(&self, kind: &str, state: Option<TaskState>) -> Result<Vec<Task>>;

    /// A dead task becomes pending and due now, with its attempts reset.
    async fn requeue_task(&self, id: &TaskId) -> Result<Task>;

    /// How many tasks of `kind` are pending, running and dead.
    async fn task_counts(&self, kind: &str) -> Result<TaskCounts> {
        let mut counts = TaskCounts::default();
        for task in self.list_tasks(kind, None).await? {
            match task.state {
                TaskState::Pending => counts.pending += 1,
                TaskState::Running => counts.running += 1,
                TaskState::Dead => counts.dead += 1,
            }
        }
        Ok(counts)
    }
}

/// Administration and the server's own duties: listing, purging, usage, statements,
/// secrets and reconciliation schedules.
#[async_trait]
pub trait Admin: Send + Sync + fmt::Debug + 'static {
    /// Records, newest first.
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>>;

    /// Deletes completed and released records whose window ended, and the repeat events
    /// that left with them; returns how many records. What they counted is folded into
    /// the usage history in the same write (fresh executions in the hour they completed,
    /// repeats in the hour they were answered), so no count is lost or counted twice.
    ///
    /// In [`Admin::purge_step`]s: on a big ledger a purge takes minutes, so each step is
    /// one bounded operation, and after each the purge waits three times as long as the
    /// step took (expired rows are spread over the whole table: a step rewrites a page for
    /// nearly every row it deletes), taking at most a quarter of the store's write time
    /// while claims keep coming. A purge cut off between steps loses nothing.
    async fn purge_expired(&self) -> Result<u64> {
        let mut total = 0;
        loop {
            let started = std::time::Instant::now();
            let step = self.purge_step().await?;
            total += step.records;
            if step.last {
                return Ok(total);
            }
            tokio::time::sleep(started.elapsed() * 3).await;
        }
    }

    /// One step of [`Admin::purge_expired`]: a batch of expired records and repeat
    /// events, folded into the usage history in the same write.
    async fn purge_step(&self) -> Result<PurgeStep>;

    /// Deletes the usage history's hours that start before `before` (the server passes
    /// now minus `usage_retention`); returns how many rows.
    async fn purge_usage(&self, before: Timestamp) -> Result<u64>;

    /// Usage per principal, route and hour from the hour that holds `since` (all when
    /// `None`): the history and what the records in the ledger add, oldest hour first,
    /// then by principal and route.
    async fn usage_by_hour(&self, since: Option<Timestamp>) -> Result<Vec<UsageHour>>;

    /// The repeats of `principal` (its keyed hash) answered from the hour that holds
    /// `since` (all when `None`), oldest first: at most `limit` listed one by one, the
    /// older ones (their records left the ledger) per route and hour, the totals over all
    /// of them.
    async fn repeat_events(
        &self,
        principal: &str,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<RepeatEvents> {
        let _ = (principal, since, limit);
        Err(StoreError::Unavailable(
            "this store keeps no repeat events".into(),
        ))
    }

    /// Usage per principal from the hour that holds `since` (all when `None`): the usage
    /// history and the records still in the ledger, so a period is covered whole
    /// whatever the routes' windows.
    async fn usage(&self, since: Option<Timestamp>) -> Result<Usage>;

    /// A secret generated once and kept in the store (e.g. the key that principals are
    /// hashed with when none is configured). Every instance on the database gets the
    /// same value.
    async fn secret(&self, name: &str) -> Result<Vec<u8>>;

    /// The reconciliation schedule of an `outcome_unknown` record (`None` for any other
    /// state, or no such record).
    async fn reconcile_schedule(&self, id: &RecordId) -> Result<Option<ReconcileSchedule>> {
        let _ = id;
        Err(StoreError::Unavailable(
            "this store keeps no reconciliation schedule".into(),
        ))
    }

    /// Sets the reconciliation schedule of an `outcome_unknown` record to `next` only if
    /// it is still `seen` (compare and set); answers whether it did. An instance that
    /// moves the schedule from what it read to "attempt n + 1, held until ..." is the
    /// only one to ask the upstream for that attempt.
    async fn schedule_reconcile(
        &self,
        id: &RecordId,
        seen: ReconcileSchedule,
        next: ReconcileSchedule,
    ) -> Result<bool> {
        let _ = (id, seen, next);
        Err(StoreError::Unavailable(
            "this store keeps no reconciliation schedule".into(),
        ))
    }
}

/// What one [`Admin::purge_step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeStep {
    /// How many records it deleted.
    pub records: u64,
    /// Whether it found less than a whole batch of each kind: nothing expired is left.
    pub last: bool,
}

/// A new record id: time-ordered, opaque.
pub fn new_record_id() -> RecordId {
    RecordId(format!("rec_{}", uuid::Uuid::now_v7().simple()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_hour_starts_on_the_hour_and_never_overflows() {
        assert_eq!(hour_of(Timestamp(7_199_999)), Timestamp(3_600_000));
        assert_eq!(hour_of(Timestamp(7_200_000)), Timestamp(7_200_000));
        assert_eq!(hour_of(Timestamp(-1)), Timestamp(-3_600_000));
        assert!(hour_of(Timestamp(i64::MIN)).0 <= i64::MIN + 3_600_000);
    }
}
