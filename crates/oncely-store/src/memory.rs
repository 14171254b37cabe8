//! An in-memory store for unit tests: the transitions of `oncely_core::record` behind one
//! mutex. Clones share the same data, like two instances on one database.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use oncely_core::{
    ClaimSpec, Completion, Fence, Record, RecordId, Resolution, Scope, State, TakeOverOutcome,
    Timestamp,
};

use crate::plan::plan_claims;
use crate::queue::{Finished, NewTask, Task, TaskError, TaskFence, TaskId};
use crate::queue::{TaskOutcome, TaskState};
use crate::usage::{per_principal, period_start, Hours};
use crate::waiters::{wait_until_settled, Waiters};
use crate::{
    Admin, ChurnEntry, ChurnFilter, ChurnKind, Claim, Clock, Ledger, ListFilter, PurgeStep,
    ReconcileSchedule, Repeat, RepeatEvent, RepeatEvents, Result, StoreError, TaskQueue, Usage,
    UsageHour, Waiting,
};

#[derive(Debug, Default)]
struct Data {
    records: HashMap<RecordId, Record>,
    by_key: HashMap<(Scope, String), RecordId>,
    secrets: HashMap<String, Vec<u8>>,
    tasks: BTreeMap<TaskId, Task>,
    /// Reconciliation schedules, by record, with the `updated_at` they belong to.
    reconcile: HashMap<RecordId, (Timestamp, ReconcileSchedule)>,
    /// Repeat events, oldest first, with their record's principal; they go with their
    /// record (at the purge after it left), folded into `usage`.
    repeats: Vec<(String, RepeatEvent)>,
    /// The usage history: what records and repeat events counted when they left.
    usage: Hours,
    /// The churn table (module `churn`).
    churn: HashMap<[u8; 16], ChurnEntry>,
}

impl Data {
    fn reconcile_schedule(&self, id: &RecordId) -> Option<ReconcileSchedule> {
        let record = self.records.get(id)?;
        if record.state != State::OutcomeUnknown {
            return None;
        }
        Some(match self.reconcile.get(id) {
            Some((since, schedule)) if *since == record.updated_at => *schedule,
            _ => ReconcileSchedule::default(),
        })
    }
}

/// The in-memory store. Not durable: for tests only.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    data: Arc<Mutex<Data>>,
    waiters: Arc<Waiters>,
    clock: Arc<dyn Clock>,
    churn: Arc<ChurnFilter>,
}

impl MemoryStore {
    /// An empty store on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            data: Arc::default(),
            waiters: Arc::default(),
            clock,
            churn: Arc::default(),
        }
    }

    fn with_record<T>(
        &self,
        id: &RecordId,
        f: impl FnOnce(&mut Record, Timestamp) -> Result<T>,
    ) -> Result<T> {
        let now = self.clock.now();
        let out = {
            let mut data = self.data.lock().expect("memory store lock");
            let record = data
                .records
                .get_mut(id)
                .ok_or_else(|| StoreError::NotFound(id.clone()))?;
            // Work on a copy so a refused transition changes nothing.
            let mut copy = record.clone();
            let out = f(&mut copy, now)?;
            *record = copy;
            out
        };
        self.waiters.wake(id);
        Ok(out)
    }
}

#[async_trait]
impl Ledger for MemoryStore {
    async fn claim(&self, spec: &ClaimSpec) -> Result<Claim> {
        let now = self.clock.now();
        let mut data = self.data.lock().expect("memory store lock");
        let map_key = (spec.scope.clone(), spec.key.clone());
        let existing = data
            .by_key
            .get(&map_key)
            .and_then(|id| data.records.get(id))
            .cloned();
        let plan = plan_claims(std::slice::from_ref(spec), None, now, |_, _| {
            Ok(existing.clone())
        })?;
        match plan {
            Err(existing) => Ok(Claim::Existing(existing)),
            Ok(mut records) => {
                let (replaces, record) = records.pop().expect("a granted plan has a record");
                if let Some(old) = replaces {
                    // An expired record renewed in place leaves the ledger: its count stays.
                    if let Some(gone) = data.records.remove(&old) {
                        data.usage.add_record(&gone);
                    }
                }
                data.by_key.insert(map_key, record.id.clone());
                data.records.insert(record.id.clone(), record.clone());
                Ok(Claim::Owned(record))
            }
        }
    }

    async fn complete(&self, fence: &Fence, completion: Completion) -> Result<Record> {
        self.with_record(&fence.id, |r, now| {
            r.complete(fence, completion, now)?;
            Ok(r.clone())
        })
    }

    async fn release(
        &self,
        fence: &Fence,
        error: Option<String>,
        window: Duration,
    ) -> Result<Record> {
        self.with_record(&fence.id, |r, now| {
            r.release(fence, error, window, now)?;
            Ok(r.clone())
        })
    }

    async fn mark_unknown(&self, fence: &Fence, error: String) -> Result<Record> {
        self.with_record(&fence.id, |r, now| {
            r.mark_unknown(fence, error, now)?;
            Ok(r.clone())
        })
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<()> {
        self.with_record(&fence.id, |r, now| Ok(r.renew(fence, lease, now)?))
    }

    async fn take_over(
        &self,
        id: &RecordId,
        expected_attempt: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<TakeOverOutcome> {
        self.with_record(id, |r, now| {
            Ok(r.take_over(expected_attempt, owner, lease, now)?)
        })
    }

    async fn get(&self, id: &RecordId) -> Result<Option<Record>> {
        Ok(self
            .data
            .lock()
            .expect("memory store lock")
            .records
            .get(id)
            .cloned())
    }

    async fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<Record>> {
        let data = self.data.lock().expect("memory store lock");
        Ok(data
            .by_key
            .get(&(scope.clone(), key.to_string()))
            .and_then(|id| data.records.get(id))
            .cloned())
    }

    async fn resolve(&self, id: &RecordId, resolution: Resolution) -> Result<Record> {
        self.with_record(id, |r, now| {
            r.resolve(resolution, now)?;
            Ok(r.clone())
        })
    }

    async fn record_repeats(
        &self,
        id: &RecordId,
        principal: &str,
        route: &str,
        repeats: &[Repeat],
    ) -> Result<()> {
        let mut data = self.data.lock().expect("memory store lock");
        // A record already purged: its repeats are kept all the same, and folded with
        // the next purge.
        if let Some(r) = data.records.get_mut(id) {
            r.repeats += repeats.iter().map(|e| e.count).sum::<u64>();
            r.repeat_units += repeats.iter().map(|e| e.units).sum::<u64>();
        }
        for e in repeats {
            data.repeats.push((
                principal.to_owned(),
                RepeatEvent {
                    record: id.clone(),
                    route: route.to_owned(),
                    at: e.at,
                    kind: e.kind,
                    count: e.count,
                    units: e.units,
                },
            ));
        }
        Ok(())
    }

    async fn now(&self) -> Result<Timestamp> {
        Ok(self.clock.now())
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    fn churn_filter(&self) -> Option<&ChurnFilter> {
        Some(&self.churn)
    }

    async fn churn_get(&self, hash: &[u8; 16]) -> Result<Option<ChurnEntry>> {
        let data = self.data.lock().expect("memory store lock");
        Ok(data.churn.get(hash).cloned())
    }

    async fn churn_put(&self, entry: &ChurnEntry) -> Result<bool> {
        let mut data = self.data.lock().expect("memory store lock");
        if data.churn.contains_key(&entry.hash) {
            return Ok(false);
        }
        data.churn.insert(entry.hash, entry.clone());
        let e = entry.clone();
        self.churn
            .add(e.hash, e.record, e.kind, e.until, self.clock.now());
        Ok(true)
    }

    async fn churn_forget(&self, id: &RecordId) -> Result<()> {
        let mut data = self.data.lock().expect("memory store lock");
        data.churn
            .retain(|_, e| !(e.record == *id && e.kind == ChurnKind::Undelivered));
        self.churn.delivered(id);
        Ok(())
    }

    async fn churn_of(&self, id: &RecordId) -> Result<Vec<ChurnEntry>> {
        let data = self.data.lock().expect("memory store lock");
        let mut out: Vec<ChurnEntry> = data.churn.values().cloned().collect();
        out.retain(|e| e.record == *id);
        out.sort_by_key(|e| e.at);
        Ok(out)
    }
}

#[async_trait]
impl Waiting for MemoryStore {
    async fn wait_for(&self, id: &RecordId, timeout: Duration) -> Result<Record> {
        wait_until_settled(&self.waiters, id, timeout, || async { self.get(id).await }).await
    }
}

#[async_trait]
impl TaskQueue for MemoryStore {
    async fn claim_with_task(
        &self,
        specs: &[ClaimSpec],
        completion: Option<Completion>,
        task: NewTask,
    ) -> Result<Claim> {
        let now = self.clock.now();
        let mut data = self.data.lock().expect("memory store lock");
        let records = plan_claims(specs, completion, now, |scope, key| {
            Ok(data
                .by_key
                .get(&(scope.clone(), key.to_string()))
                .and_then(|id| data.records.get(id))
                .cloned())
        })?;
        let records = match records {
            Ok(records) => records,
            Err(existing) => return Ok(Claim::Existing(existing)),
        };
        for (old, record) in &records {
            if let Some(old) = old {
                if let Some(gone) = data.records.remove(old) {
                    data.usage.add_record(&gone);
                }
                if *old == record.id {
                    // Reclaimed: an earlier task of its kind is stale (see plan_claims).
                    data.tasks
                        .retain(|_, t| t.record.as_ref() != Some(old) || t.kind != task.kind);
                }
            }
            data.by_key.insert(
                (record.scope.clone(), record.key.clone()),
                record.id.clone(),
            );
            data.records.insert(record.id.clone(), record.clone());
        }
        let first = records[0].1.clone();
        let task = Task::new(TaskId::new(), Some(first.id.clone()), task, now);
        data.tasks.insert(task.id.clone(), task);
        Ok(Claim::Owned(first))
    }

    async fn lease_tasks(
        &self,
        kind: &str,
        owner: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        let now = self.clock.now();
        let mut data = self.data.lock().expect("memory store lock");
        Ok(lease_due(&mut data, kind, owner, max, lease, now))
    }

    async fn lease_tasks_capped(
        &self,
        kind: &str,
        owner: &str,
        max_running: usize,
        lease: Duration,
    ) -> Result<Vec<Task>> {
        let now = self.clock.now();
        let mut data = self.data.lock().expect("memory store lock");
        let live = data
            .tasks
            .values()
            .filter(|t| t.kind == kind && t.state == TaskState::Running && !t.is_due(now))
            .count();
        let free = max_running.saturating_sub(live);
        Ok(lease_due(&mut data, kind, owner, free, lease, now))
    }

    async fn renew_task(&self, fence: &TaskFence, lease: Duration) -> Result<()> {
        let now = self.clock.now();
        let mut data = self.data.lock().expect("memory store lock");
        let task = data
            .tasks
            .get_mut(&fence.id)
            .ok_or_else(|| TaskError::Fenced {
                id: fence.id.clone(),
                attempt: fence.attempt,
            })?;
        task.renew(fence, lease, now)?;
        Ok(())
    }

    async fn finish_task(&self, fence: &TaskFence, outcome: TaskOutcome) -> Result<Finished> {
        let now = self.clock.now();
        let mut data = self.data.lock().expect("memory store lock");
        let task = data
            .tasks
            .get_mut(&fence.id)
            .ok_or_else(|| TaskError::Fenced {
                id: fence.id.clone(),
                attempt: fence.attempt,
            })?;
        let mut copy = task.clone();
        let finished = copy.finish(fence, outcome, now)?;
        if finished == Finished::Done {
            data.tasks.remove(&fence.id);
        } else {
            *task = copy;
        }
        Ok(finished)
    }

    async fn get_task(&self, id: &TaskId) -> Result<Option<Task>> {
        Ok(self
            .data
            .lock()
            .expect("memory store lock")
            .tasks
            .get(id)
            .cloned())
    }

    async fn list_tasks(&self, kind: &str, state: Option<TaskState>) -> Result<Vec<Task>> {
        let data = self.data.lock().expect("memory store lock");
        Ok(data
            .tasks
            .values()
            .filter(|t| t.kind == kind && state.is_none_or(|s| t.state == s))
            .cloned()
            .collect())
    }

    async fn requeue_task(&self, id: &TaskId) -> Result<Task> {
        let now = self.clock.now();
        let mut data = self.data.lock().expect("memory store lock");
        let task = data
            .tasks
            .get_mut(id)
            .ok_or_else(|| TaskError::NotFound(id.clone()))?;
        let mut copy = task.clone();
        copy.requeue(now)?;
        *task = copy.clone();
        Ok(copy)
    }
}

#[async_trait]
impl Admin for MemoryStore {
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let data = self.data.lock().expect("memory store lock");
        let mut out: Vec<Record> = data
            .records
            .values()
            .filter(|r| filter.state.is_none_or(|s| r.state == s))
            .filter(|r| filter.principal.as_ref().is_none_or(|p| &r.principal == p))
            .filter(|r| filter.route.as_ref().is_none_or(|p| &r.route == p))
            .cloned()
            .collect();
        out.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        if let Some(limit) = filter.limit {
            out.truncate(limit);
        }
        Ok(out)
    }

    async fn purge_step(&self) -> Result<PurgeStep> {
        let now = self.clock.now();
        let mut data = self.data.lock().expect("memory store lock");
        let doomed: Vec<Record> = data
            .records
            .values()
            .filter(|r| r.is_expired(now))
            .cloned()
            .collect();
        for r in &doomed {
            data.records.remove(&r.id);
            data.by_key.remove(&(r.scope.clone(), r.key.clone()));
            data.usage.add_record(r);
        }
        let Data {
            records,
            repeats,
            usage,
            churn,
            ..
        } = &mut *data;
        churn.retain(|_, e| e.until > now);
        repeats.retain(|(principal, e)| {
            let stays = records.contains_key(&e.record);
            if !stays {
                usage.add_repeat(principal, &e.route, e.at, e.kind, e.count, e.units);
            }
            stays
        });
        Ok(PurgeStep {
            records: doomed.len() as u64,
            last: true,
        })
    }

    async fn purge_usage(&self, before: Timestamp) -> Result<u64> {
        let mut data = self.data.lock().expect("memory store lock");
        Ok(data.usage.purge_before(before))
    }

    async fn usage_by_hour(&self, since: Option<Timestamp>) -> Result<Vec<UsageHour>> {
        let data = self.data.lock().expect("memory store lock");
        Ok(live_and_history(&data, since).into_rows())
    }

    async fn repeat_events(
        &self,
        principal: &str,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<RepeatEvents> {
        let from = period_start(since);
        let data = self.data.lock().expect("memory store lock");
        let mut matching: Vec<&RepeatEvent> = data
            .repeats
            .iter()
            .filter(|(p, e)| p == principal && e.at.0 >= from)
            .map(|(_, e)| e)
            .collect();
        matching.sort_by_key(|e| e.at);
        let older: Vec<UsageHour> = data
            .usage
            .rows()
            .filter(|h| h.principal == principal && h.hour.0 >= from && h.repeats > 0)
            .cloned()
            .collect();
        Ok(RepeatEvents {
            total: matching.iter().map(|e| e.count).sum::<u64>()
                + older.iter().map(|h| h.repeats).sum::<u64>(),
            total_units: matching.iter().map(|e| e.units).sum::<u64>()
                + older.iter().map(|h| h.repeat_units).sum::<u64>(),
            listed: matching.into_iter().take(limit).cloned().collect(),
            older,
        })
    }

    async fn usage(&self, since: Option<Timestamp>) -> Result<Usage> {
        let data = self.data.lock().expect("memory store lock");
        Ok(per_principal(live_and_history(&data, since).rows()))
    }

    async fn secret(&self, name: &str) -> Result<Vec<u8>> {
        let mut data = self.data.lock().expect("memory store lock");
        Ok(data
            .secrets
            .entry(name.to_string())
            .or_insert_with(|| rand::random::<[u8; 32]>().to_vec())
            .clone())
    }

    async fn reconcile_schedule(&self, id: &RecordId) -> Result<Option<ReconcileSchedule>> {
        Ok(self
            .data
            .lock()
            .expect("memory store lock")
            .reconcile_schedule(id))
    }

    async fn schedule_reconcile(
        &self,
        id: &RecordId,
        seen: ReconcileSchedule,
        next: ReconcileSchedule,
    ) -> Result<bool> {
        let mut data = self.data.lock().expect("memory store lock");
        if data.reconcile_schedule(id) != Some(seen) {
            return Ok(false);
        }
        let since = data.records[id].updated_at;
        data.reconcile.insert(id.clone(), (since, next));
        Ok(true)
    }
}

/// The history from the hour that holds `since`, with what the records and repeat
/// events still held add to it.
fn live_and_history(data: &Data, since: Option<Timestamp>) -> Hours {
    let from = period_start(since);
    let mut hours = Hours::default();
    for h in data.usage.rows().filter(|h| h.hour.0 >= from) {
        hours.add(h);
    }
    for r in data.records.values() {
        if r.completed_at.is_some_and(|done| done.0 >= from) {
            hours.add_record(r);
        }
    }
    for (principal, e) in data.repeats.iter().filter(|(_, e)| e.at.0 >= from) {
        hours.add_repeat(principal, &e.route, e.at, e.kind, e.count, e.units);
    }
    hours
}

/// Leases up to `max` due tasks of `kind`, oldest due first.
fn lease_due(
    data: &mut Data,
    kind: &str,
    owner: &str,
    max: usize,
    lease: Duration,
    now: Timestamp,
) -> Vec<Task> {
    let mut due: Vec<&mut Task> = data
        .tasks
        .values_mut()
        .filter(|t| t.kind == kind && t.is_due(now))
        .collect();
    due.sort_by_key(|t| (t.due_at(), t.id.clone()));
    let mut out = Vec::new();
    for t in due {
        if out.len() >= max {
            break;
        }
        if t.lease(owner, lease, now) {
            out.push(t.clone());
        }
    }
    out
}
