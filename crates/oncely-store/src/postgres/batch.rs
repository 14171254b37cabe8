//! Group commit of claims: concurrent claims of one instance share one statement and one
//! commit.
//!
//! A commit waits for the WAL flush (one `fdatasync`, milliseconds on many disks), so one
//! claim per commit caps throughput at `pool size / flush time`. Claims queue here; a
//! dispatcher takes every claim waiting when a connection frees up and inserts them with
//! one `INSERT ... SELECT FROM unnest(...) ON CONFLICT (claim) DO NOTHING`. Alone, a
//! claim runs at once with the single-row statement, so latency does not suffer. The
//! claims that found their key held read the rows holding them in one more statement on
//! the same connection (only they pay for it).
//!
//! Each claim gets back its own row (owned), the row already holding its key (then the
//! caller decides: existing, reclaim or renew), or nothing (the holder was purged between
//! the statements, its row holds another key's colliding hash, or the batch must be
//! retried one by one).

use std::collections::HashMap;
use std::sync::Arc;

use std::future::Future;

use oncely_core::{ClaimSpec, Completion, Fence, Record, RecordId};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;
use tokio_postgres::Row;

use deadpool_postgres::Pool;

use super::connection::checkout;
use super::error::{corrupt, unavailable};
use super::listener::CHANNEL;
use super::rows::{attempt_param, cols, millis, record_from_row, ResponseColumns, COLUMNS};
use super::sql::{AT, CLAIM_INSERT, SQL};
use crate::{Result, StoreError};

/// At most this many claims share one statement.
const MAX_BATCH: usize = 512;

/// What the claim statement said about one claim.
pub(super) enum Claimed {
    /// A new row, owned by this claim.
    Inserted(Record),
    /// The row holding the key, and the database's time of the statement.
    Held(Record, i64),
    /// Nothing visible: read again (or retry alone).
    Retry,
}

struct Job {
    id: RecordId,
    /// `spec.scope.claim_hash(&spec.key)`.
    claim: [u8; 16],
    spec: ClaimSpec,
    offset: i64,
    reply: oneshot::Sender<Result<Claimed>>,
}

/// A queue of jobs that a dispatcher runs in groups, at most `in_flight` groups at a time.
struct Group<J> {
    tx: mpsc::UnboundedSender<J>,
    task: JoinHandle<()>,
}

impl<J: Send + 'static> Group<J> {
    fn start<F, Fut>(pool: Pool, in_flight: usize, run: F) -> Group<J>
    where
        F: Fn(Pool, Vec<J>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<J>();
        let task = tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(in_flight.max(1)));
            while let Some(first) = rx.recv().await {
                // Jobs keep queueing while every slot is busy; they all go in the next group.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let mut jobs = vec![first];
                while jobs.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(job) => jobs.push(job),
                        Err(_) => break,
                    }
                }
                let group = run(pool.clone(), jobs);
                tokio::spawn(async move {
                    group.await;
                    drop(slot);
                });
            }
        });
        Group { tx, task }
    }

    fn send(&self, job: J) -> Result<()> {
        self.tx
            .send(job)
            .map_err(|_| StoreError::Unavailable("the PostgreSQL store is closing".into()))
    }
}

impl<J> Drop for Group<J> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Groups claims and completions.
pub(super) struct Batcher {
    claims: Group<Job>,
    completions: Group<CompleteJob>,
}

impl Batcher {
    /// Starts the dispatchers: at most `in_flight` statements of each kind at a time.
    pub(super) fn start(pool: Pool, in_flight: usize) -> Batcher {
        Batcher {
            claims: Group::start(pool.clone(), in_flight, |pool, jobs| async move {
                run(&pool, jobs).await
            }),
            completions: Group::start(pool, in_flight, |pool, jobs| async move {
                run_completions(&pool, jobs).await
            }),
        }
    }

    /// Claims `spec` with the record id `id` (used if a row is inserted).
    pub(super) async fn claim(
        &self,
        id: RecordId,
        spec: &ClaimSpec,
        offset: i64,
    ) -> Result<Claimed> {
        let (reply, answer) = oneshot::channel();
        self.claims.send(Job {
            id,
            claim: spec.scope.claim_hash(&spec.key),
            spec: spec.clone(),
            offset,
            reply,
        })?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the PostgreSQL store is closing".into()))?
    }

    /// Completes the record `fence` names, grouped with other completions.
    pub(super) async fn complete(
        &self,
        fence: &Fence,
        completion: &Completion,
        offset: i64,
    ) -> Result<Completed> {
        let (reply, answer) = oneshot::channel();
        self.completions.send(CompleteJob {
            fence: fence.clone(),
            completion: completion.clone(),
            offset,
            reply,
        })?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the PostgreSQL store is closing".into()))?
    }
}

/// Runs one batch and answers every claim in it.
async fn run(pool: &Pool, mut jobs: Vec<Job>) {
    let offset = jobs[0].offset;
    // One order for every batch, so two batches never wait for each other's rows in
    // opposite orders (a deadlock).
    jobs.sort_by_key(|j| j.claim);
    match execute(pool, offset, &jobs).await {
        Ok(steps) => {
            for (job, step) in jobs.into_iter().zip(steps) {
                let _ = job.reply.send(Ok(step));
            }
        }
        // A deadlock or serialization failure is retried claim by claim.
        Err(Failure::Conflict) => {
            for job in jobs {
                let _ = job.reply.send(Ok(Claimed::Retry));
            }
        }
        // Anything else (the server is gone) is every claim's answer.
        Err(Failure::Store(e)) => {
            let text = match e {
                StoreError::Unavailable(text) => text,
                other => other.to_string(),
            };
            for job in jobs {
                let _ = job.reply.send(Err(StoreError::Unavailable(text.clone())));
            }
        }
    }
}

enum Failure {
    Conflict,
    Store(StoreError),
}

async fn execute(pool: &Pool, offset: i64, jobs: &[Job]) -> Result<Vec<Claimed>, Failure> {
    let client = checkout(pool).await.map_err(Failure::Store)?;
    let mut rows = if jobs.len() == 1 {
        let (job, spec) = (&jobs[0], &jobs[0].spec);
        let stmt = client.prepare_cached(&SQL.claim).await.map_err(failure)?;
        client
            .query(
                &stmt,
                &[
                    &offset,
                    &job.id.0,
                    &spec.scope.as_str(),
                    &spec.key,
                    &spec.fingerprint.0.as_slice(),
                    &spec.class.as_str(),
                    &spec.route,
                    &spec.principal,
                    &spec.owner,
                    &millis(spec.lease),
                    &spec.workflow_id,
                    &job.claim.as_slice(),
                ],
            )
            .await
            .map_err(failure)?
    } else {
        let stmt = client.prepare_cached(&SQL_BATCH).await.map_err(failure)?;
        let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        let scopes: Vec<&str> = jobs.iter().map(|j| j.spec.scope.as_str()).collect();
        let keys: Vec<&str> = jobs.iter().map(|j| j.spec.key.as_str()).collect();
        let fingerprints: Vec<&[u8]> = jobs
            .iter()
            .map(|j| j.spec.fingerprint.0.as_slice())
            .collect();
        let classes: Vec<&str> = jobs.iter().map(|j| j.spec.class.as_str()).collect();
        let routes: Vec<&str> = jobs.iter().map(|j| j.spec.route.as_str()).collect();
        let principals: Vec<&str> = jobs.iter().map(|j| j.spec.principal.as_str()).collect();
        let owners: Vec<&str> = jobs.iter().map(|j| j.spec.owner.as_str()).collect();
        let leases: Vec<i64> = jobs.iter().map(|j| millis(j.spec.lease)).collect();
        let workflows: Vec<Option<&str>> =
            jobs.iter().map(|j| j.spec.workflow_id.as_deref()).collect();
        let claims: Vec<&[u8]> = jobs.iter().map(|j| j.claim.as_slice()).collect();
        client
            .query(
                &stmt,
                &[
                    &offset,
                    &ids,
                    &scopes,
                    &keys,
                    &fingerprints,
                    &classes,
                    &routes,
                    &principals,
                    &owners,
                    &leases,
                    &workflows,
                    &claims,
                ],
            )
            .await
            .map_err(failure)?
    };
    // The claims whose key was held: the rows holding them, read after the insert (so
    // a holder that committed meanwhile is seen).
    let held: Vec<&[u8]> = jobs
        .iter()
        .filter(|j| !rows.iter().any(|r| inserted_id(r) == Some(j.id.as_str())))
        .map(|j| j.claim.as_slice())
        .collect();
    if !held.is_empty() {
        let stmt = client
            .prepare_cached(&SQL.claim_read)
            .await
            .map_err(failure)?;
        rows.extend(
            client
                .query(&stmt, &[&offset, &held])
                .await
                .map_err(failure)?,
        );
    }
    claimed(jobs, &rows).map_err(Failure::Store)
}

/// The id of the row an insert returned.
fn inserted_id(row: &Row) -> Option<&str> {
    row.try_get::<_, &str>("id").ok()
}

/// Matches the returned rows to the claims by `(scope, key)`.
fn claimed(jobs: &[Job], rows: &[Row]) -> Result<Vec<Claimed>> {
    let mut found: HashMap<(String, String), (Record, bool, i64)> =
        HashMap::with_capacity(rows.len());
    for row in rows {
        let inserted: bool = row.try_get("inserted").map_err(corrupt)?;
        let now: i64 = row.try_get("now").map_err(corrupt)?;
        let record = record_from_row(row)?;
        let key = (record.scope.as_str().to_string(), record.key.clone());
        // The row this statement inserted wins over any other it read for the key.
        if !inserted && found.get(&key).is_some_and(|(_, mine, _)| *mine) {
            continue;
        }
        found.insert(key, (record, inserted, now));
    }
    Ok(jobs
        .iter()
        .map(|job| {
            let key = (job.spec.scope.as_str().to_string(), job.spec.key.clone());
            match found.get(&key) {
                Some((r, true, _)) if r.id == job.id => Claimed::Inserted(r.clone()),
                Some((r, _, now)) => Claimed::Held(r.clone(), *now),
                None => Claimed::Retry,
            }
        })
        .collect())
}

fn failure(e: tokio_postgres::Error) -> Failure {
    let conflict = e.code().is_some_and(|c| {
        *c == tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED
            || *c == tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
    });
    if conflict {
        Failure::Conflict
    } else {
        Failure::Store(unavailable(e))
    }
}

/// The claim of many keys in one plain statement; `$2..$12` are arrays in the order of
/// the single-row claim's parameters, inserted in the order given (the claim hashes'),
/// so that two groups never wait for each other's keys in opposite orders. It returns
/// the rows it inserted; `SQL.claim_read` reads the others.
static SQL_BATCH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{CLAIM_INSERT}
         SELECT i.id, i.claim, i.scope, i.key, i.fingerprint, i.class, i.route, i.principal,
                'processing', i.owner, 1, {AT} + i.lease, {AT}, {AT}, i.workflow_id
         FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::text[],
                     $8::text[], $9::text[], $10::bigint[], $11::text[], $12::bytea[])
             WITH ORDINALITY AS i(id, scope, key, fingerprint, class, route, principal, owner,
                                  lease, workflow_id, claim, n)
         ORDER BY i.n
         ON CONFLICT (claim) DO NOTHING
         RETURNING true AS inserted, created_at AS now, {ins}",
        ins = COLUMNS.join(", "),
    )
});

/// What the grouped fenced completion said about one completion.
pub(super) enum Completed {
    /// The record, completed.
    Done(Box<Record>),
    /// The fence matched no row: the caller explains the refusal.
    Refused,
    /// The group failed on a conflict: complete alone.
    Retry,
}

struct CompleteJob {
    fence: Fence,
    completion: Completion,
    offset: i64,
    reply: oneshot::Sender<Result<Completed>>,
}

async fn run_completions(pool: &Pool, mut jobs: Vec<CompleteJob>) {
    jobs.sort_by(|a, b| a.fence.id.cmp(&b.fence.id));
    match execute_completions(pool, &jobs).await {
        Ok(mut done) => {
            for job in jobs {
                let answer = match done.remove(&job.fence) {
                    Some(record) => Completed::Done(Box::new(record)),
                    None => Completed::Refused,
                };
                let _ = job.reply.send(Ok(answer));
            }
        }
        Err(Failure::Conflict) => {
            for job in jobs {
                let _ = job.reply.send(Ok(Completed::Retry));
            }
        }
        Err(Failure::Store(e)) => {
            let text = match e {
                StoreError::Unavailable(text) => text,
                other => other.to_string(),
            };
            for job in jobs {
                let _ = job.reply.send(Err(StoreError::Unavailable(text.clone())));
            }
        }
    }
}

/// Completes every fenced record it can; returns each by the fence that completed it.
async fn execute_completions(
    pool: &Pool,
    jobs: &[CompleteJob],
) -> Result<HashMap<Fence, Record>, Failure> {
    let client = checkout(pool).await.map_err(Failure::Store)?;
    let offset = jobs[0].offset;
    let mut responses = Vec::with_capacity(jobs.len());
    for job in jobs {
        responses
            .push(ResponseColumns::of(Some(&job.completion.response)).map_err(Failure::Store)?);
    }
    let rows = if jobs.len() == 1 {
        let (job, response) = (&jobs[0], &responses[0]);
        let stmt = client
            .prepare_cached(&SQL.complete)
            .await
            .map_err(failure)?;
        client
            .query(
                &stmt,
                &[
                    &offset,
                    &job.fence.id.0,
                    &job.fence.owner,
                    &attempt_param(job.fence.attempt),
                    &millis(job.completion.window),
                    &job.completion.replay_until.map(|t| t.0),
                    &response.status,
                    &response.headers,
                    &response.body,
                    &(job.completion.units as i64),
                    &job.completion.provider_request_id,
                    &job.completion.trace,
                ],
            )
            .await
            .map_err(failure)?
    } else {
        let stmt = client
            .prepare_cached(&SQL_COMPLETE_BATCH)
            .await
            .map_err(failure)?;
        let ids: Vec<&str> = jobs.iter().map(|j| j.fence.id.as_str()).collect();
        let owners: Vec<&str> = jobs.iter().map(|j| j.fence.owner.as_str()).collect();
        let attempts: Vec<i32> = jobs
            .iter()
            .map(|j| attempt_param(j.fence.attempt))
            .collect();
        let windows: Vec<i64> = jobs.iter().map(|j| millis(j.completion.window)).collect();
        let untils: Vec<Option<i64>> = jobs
            .iter()
            .map(|j| j.completion.replay_until.map(|t| t.0))
            .collect();
        let statuses: Vec<Option<i32>> = responses.iter().map(|r| r.status).collect();
        let headers: Vec<Option<&str>> = responses.iter().map(|r| r.headers.as_deref()).collect();
        let bodies: Vec<Option<&[u8]>> = responses.iter().map(|r| r.body.as_deref()).collect();
        let units: Vec<i64> = jobs.iter().map(|j| j.completion.units as i64).collect();
        let request_ids: Vec<Option<&str>> = jobs
            .iter()
            .map(|j| j.completion.provider_request_id.as_deref())
            .collect();
        let traces: Vec<Option<&str>> =
            jobs.iter().map(|j| j.completion.trace.as_deref()).collect();
        client
            .query(
                &stmt,
                &[
                    &offset,
                    &ids,
                    &owners,
                    &attempts,
                    &windows,
                    &untils,
                    &statuses,
                    &headers,
                    &bodies,
                    &units,
                    &request_ids,
                    &traces,
                ],
            )
            .await
            .map_err(failure)?
    };
    let mut done = HashMap::with_capacity(rows.len());
    for row in &rows {
        let record = record_from_row(row).map_err(Failure::Store)?;
        // Only the fence of the record's owner and attempt can have completed it.
        let fence = jobs.iter().map(|j| &j.fence).find(|f| {
            f.id == record.id
                && Some(&f.owner) == record.owner.as_ref()
                && f.attempt == record.attempt
        });
        if let Some(fence) = fence {
            done.insert(fence.clone(), record);
        }
    }
    Ok(done)
}

/// The fenced completion of many records in one plain statement; `$2..$12` are arrays.
/// The state is tested as `(...) IS TRUE`, which no index answers: the rows are found by
/// id through the primary key, never by a scan of `records_open`'s processing entries
/// (which the planner thinks few, and which hold every completion since the last vacuum).
static SQL_COMPLETE_BATCH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE records r SET state = 'completed', lease_until = NULL, completed_at = {AT},
             expires_at = LEAST({AT} + i.win, COALESCE(i.until, 9223372036854775807)),
             response_status = i.status, response_headers = i.headers,
             response_body = i.body, units = i.units,
             provider_request_id = COALESCE(i.prid, r.provider_request_id),
             updated_at = {AT}, last_error = NULL, trace = COALESCE(i.trace, r.trace)
         FROM unnest($2::text[], $3::text[], $4::integer[], $5::bigint[], $6::bigint[],
                     $7::integer[], $8::text[], $9::bytea[], $10::bigint[], $11::text[],
                     $12::text[])
             AS i(id, owner, attempt, win, until, status, headers, body, units, prid, trace)
         WHERE r.id = i.id AND r.owner = i.owner AND r.attempt = i.attempt
           AND (r.state = 'processing') IS TRUE
         RETURNING {r},
             CASE WHEN r.waiting > 0 THEN pg_notify('{channel}', r.id) END AS notified",
        r = cols("r"),
        channel = CHANNEL,
    )
});
