//! Leases as this process observed them, on the monotonic clock: the one rule by which
//! the SQLite and PostgreSQL stores decide that a lease lapsed.
//!
//! A lease is stored as `lease_until` with the time of its last renewal (`updated_at`).
//! Neither may be trusted alone to say that the owner is gone:
//!
//! - a step of the wall clock (NTP, an operator) must neither let a live owner be taken
//!   over nor hold a dead one's work (SQLite stamps leases with this host's clock);
//! - a lease is dated when the statement that wrote it began, and becomes visible only
//!   when it commits: a commit that waited (PostgreSQL's synchronous standby away, a
//!   stalled disk) shows a renewal, or a claim, that is already lapsed by the store's
//!   clock the moment anyone can read it, while its owner is alive and renews again
//!   (the chaos run found a `write` executed twice 20 ms apart so).
//!
//! So this process decides that a lease lapsed only by what it observed: the lease's
//! token (attempt and `lease_until`, which every renewal changes) unchanged for its whole
//! length (`lease_until - updated_at`) of monotonic time since this process first saw
//! it. A live owner renews every third of its lease, so whoever watches sees the token
//! change before that; an owner that died is taken over one lease after it was first
//! seen without renewals (after a restart of this process: one lease after the restart).
//! PostgreSQL also requires the lease to be lapsed by the database's clock, and the server
//! to have been up for a whole lease (`postgres::sql::UP`).
//!
//! The observations are the process's own, shared by every store it opens (record and
//! task ids are unique), and written ones count: a claim, renewal or take-over made here
//! starts its lease's watch at once.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use oncely_core::{Record, State, Timestamp};

use crate::{Task, TaskState};

/// When this process first saw one lease token.
#[derive(Debug, Clone, Copy)]
struct Seen {
    token: (u32, i64),
    since: Duration,
    length: Duration,
}

/// The watched leases, and the size at which those lapsed a while ago are forgotten.
struct Watched {
    seen: HashMap<String, Seen>,
    prune_at: usize,
}

/// The first size at which lapsed leases are forgotten (it doubles while more are live).
const PRUNE_AT: usize = 10_000;
/// How long past its end a lapsed lease's watch is kept.
const KEEP_LAPSED: Duration = Duration::from_secs(60);

fn watched() -> std::sync::MutexGuard<'static, Watched> {
    static WATCHED: OnceLock<Mutex<Watched>> = OnceLock::new();
    WATCHED
        .get_or_init(|| {
            Mutex::new(Watched {
                seen: HashMap::new(),
                prune_at: PRUNE_AT,
            })
        })
        .lock()
        .expect("lease watch lock")
}

/// Stops watching `id` (its lease ended here: completed, released, finished). Forgetting
/// too early only makes the next look start the watch again, later.
pub(crate) fn forget(id: &str) {
    watched().seen.remove(id);
}

/// How long the lease `(attempt, until)` of `id`, renewed at `renewed`, still holds as
/// this process observed it at monotonic time `mono` (zero: it lapsed). For a store that
/// reads only a lease's columns; [`record_remaining`] and [`task_remaining`] take a whole
/// record or task.
pub(crate) fn remaining(
    id: &str,
    attempt: u32,
    until: Timestamp,
    renewed: Timestamp,
    mono: Duration,
) -> Duration {
    let token = (attempt, until.0);
    let length = Duration::from_millis(until.0.saturating_sub(renewed.0).max(0) as u64);
    let mut watched = watched();
    if watched.seen.len() >= watched.prune_at {
        watched
            .seen
            .retain(|_, s| mono.saturating_sub(s.since) < s.length + KEEP_LAPSED);
        watched.prune_at = (watched.seen.len() * 2).max(PRUNE_AT);
    }
    let entry = watched.seen.entry(id.to_string()).or_insert(Seen {
        token,
        since: mono,
        length,
    });
    if entry.token != token {
        *entry = Seen {
            token,
            since: mono,
            length,
        };
    }
    entry
        .length
        .saturating_sub(mono.saturating_sub(entry.since))
}

/// What is left of a processing record's lease (zero for any other record, or no lease).
pub(crate) fn record_remaining(r: &Record, mono: Duration) -> Duration {
    match (r.state, r.lease_until) {
        (State::Processing, Some(until)) => {
            remaining(r.id.as_str(), r.attempt, until, r.updated_at, mono)
        }
        _ => Duration::ZERO,
    }
}

/// What is left of a running task's lease (zero for any other task, or no lease).
pub(crate) fn task_remaining(t: &Task, mono: Duration) -> Duration {
    match (t.state, t.lease_until) {
        (TaskState::Running, Some(until)) => {
            remaining(t.id.as_str(), t.attempts, until, t.updated_at, mono)
        }
        _ => Duration::ZERO,
    }
}

/// A record as this process sees it: a processing record's `lease_until` is where its
/// lease ends by this process's observation, on the wall clock of `now`, so that callers
/// comparing it with `now` decide as the store does.
///
/// Where the observation agrees with the stored `lease_until` to within
/// [`AGREE_WITHIN`] (no clock step: the two clocks only round differently), the stored
/// value is kept, so that two reads of one unchanged lease give the same record.
pub(crate) fn as_observed(mut r: Record, now: Timestamp, mono: Duration) -> Record {
    if let (State::Processing, Some(until)) = (r.state, r.lease_until) {
        let observed = now.plus(record_remaining(&r, mono));
        if (observed.0 - until.0).abs() > AGREE_WITHIN.as_millis() as i64 {
            r.lease_until = Some(observed);
        }
    }
    r
}

/// How far the observed end of a lease may lie from the stored one and still be taken
/// for the same instant (wall and monotonic time are read separately and rounded to
/// milliseconds; a clock step is far larger).
const AGREE_WITHIN: Duration = Duration::from_millis(100);
