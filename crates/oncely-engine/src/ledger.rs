//! The engine's ledger operations and an owner's writes: every ledger operation is
//! bounded by the store itself ([`STORE_ANSWER`]); an owner's write that fails is retried with
//! backoff for as long as that owner still owns the record (each retry counted in
//! `oncely_ledger_write_retries_total{op}` and logged); its lease is kept renewed from a
//! task of its own ([`Lease`]); and a call that ends without an answer to store is
//! released or marked unknown ([`settle`]); and the owners running in this process
//! ([`Live`]). The owner task (`owner`), the claim loop (`claim`) and the engine
//! (`engine`) use this module; it uses none of them.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncely_core::backoff;
use oncely_core::{Completion, Disposition, Fence, Record};
use oncely_store::{Store, StoreError};

// A failed ledger write is tried again as a failed lease renewal is: from 50 ms,
// doubling up to 2 s (`oncely_store::lease`).
use oncely_store::lease::{RETRY_FIRST as WRITE_RETRY_FIRST, RETRY_MAX as WRITE_RETRY_MAX};
/// How long an owner keeps trying to write its outcome. Its ownership has no end of its
/// own (a late write lands unless another owner took the record over, which fencing
/// tells), so this only bounds the life of a task whose ledger never comes back.
const WRITE_RETRY_FOR: Duration = Duration::from_secs(3600);

/// The longest one ledger operation may take: the store's bound
/// ([`oncely_store::Bounded`], which every store [`oncely_store::open`] hands out is
/// wrapped in). The engine relies on it and adds none of its own.
pub use oncely_store::ANSWER_WITHIN as STORE_ANSWER;

/// The owners running in this process, by owner id. A record one of them owns has a live
/// owner whatever the ledger's clocks say of its lease: a store that stalled past the lease
/// (a SQLite write lock held for seconds, a PostgreSQL commit that waited) kept its
/// renewals from landing, not its owner from running. No claimant takes such a record
/// over (the claim loop, `claim`).
#[derive(Clone, Default)]
pub(crate) struct Live(Arc<std::sync::Mutex<std::collections::HashSet<String>>>);

impl Live {
    /// Counts `owner` as running until the returned guard is dropped.
    pub(crate) fn hold(&self, owner: &str) -> Held {
        self.0.lock().expect("live owners").insert(owner.to_owned());
        Held {
            live: self.clone(),
            owner: owner.to_owned(),
        }
    }

    pub(crate) fn holds(&self, record: &Record) -> bool {
        record
            .owner
            .as_deref()
            .is_some_and(|o| self.0.lock().expect("live owners").contains(o))
    }
}

/// One running owner of [`Live`]'s, until dropped.
pub(crate) struct Held {
    live: Live,
    owner: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.live.0.lock().expect("live owners").remove(&self.owner);
    }
}

/// Keeps the lease alive from a task of its own, renewing every third of it (sooner,
/// with backoff, after a failed renewal), until dropped or until the store says another
/// owner took the record over.
pub(crate) struct Lease(tokio::task::JoinHandle<()>);

impl Lease {
    pub(crate) fn start(store: Arc<dyn Store>, fence: Fence, lease: Duration) -> Lease {
        Lease(tokio::spawn(renew_loop(store, fence, lease)))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn renew_loop(store: Arc<dyn Store>, fence: Fence, lease: Duration) {
    let refused = oncely_store::lease::keep(
        lease,
        || store.renew(&fence, lease),
        |e, pause| count_retry("renew", &fence, e, pause),
    )
    .await;
    // Another owner took the record over (or it is gone): this call runs on, but its
    // result will be refused by the store.
    tracing::warn!(record = %fence.id, attempt = fence.attempt, error = %refused, "lease renewal refused");
}

/// A write worth trying again: the store could not be reached or refused for a reason
/// of its own (busy, pool timeout, failed commit). A refused transition (another owner,
/// another state) or a missing record is final.
fn retryable(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_))
}

fn count_retry(op: &'static str, fence: &Fence, e: &StoreError, pause: Duration) {
    metrics::counter!("oncely_ledger_write_retries_total", "op" => op).increment(1);
    tracing::warn!(
        target: "oncely::store",
        record = %fence.id,
        attempt = fence.attempt,
        op,
        error = %e,
        retry_in_ms = pause.as_millis() as u64,
        "ledger write failed; retrying while this owner owns the record"
    );
}

/// Runs one owner's ledger write until it lands, the store refuses it for good, or
/// [`WRITE_RETRY_FOR`] has passed.
pub(crate) async fn write<T, F, Fut>(
    op: &'static str,
    fence: &Fence,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let give_up = Instant::now() + WRITE_RETRY_FOR;
    let mut failures = 0u32;
    loop {
        match attempt().await {
            Err(e) if retryable(&e) && Instant::now() < give_up => {
                let pause = backoff::exponential(WRITE_RETRY_FIRST, failures, WRITE_RETRY_MAX);
                count_retry(op, fence, &e, pause);
                tokio::time::sleep(pause).await;
                failures = failures.saturating_add(1);
            }
            other => return other,
        }
    }
}

/// Releases or marks unknown (never stores), retrying while the store fails; returns the
/// record as written, or as it was when the store refused.
pub(crate) async fn settle(
    store: &dyn Store,
    record: &Record,
    fence: &Fence,
    disposition: Disposition,
    why: String,
    window: Duration,
) -> Record {
    let result = match disposition {
        Disposition::OutcomeUnknown => {
            write("mark_unknown", fence, || {
                store.mark_unknown(fence, why.clone())
            })
            .await
        }
        Disposition::Release | Disposition::Store => {
            write("release", fence, || {
                store.release(fence, Some(why.clone()), window)
            })
            .await
        }
    };
    match result {
        Ok(r) => r,
        Err(e) => {
            log_write_failure(record, "settle", &e);
            record.clone()
        }
    }
}

/// The owner has the upstream's answer, but its `complete` was refused. If that is
/// because its own attempt was marked `outcome_unknown` meanwhile (its lease lapsed while
/// the ledger was away from it, and a duplicate or a sweep took the record over), the
/// outcome is not unknown after all: it is resolved with this answer, so that duplicates
/// get it instead of a 409 until someone reconciles. Anything else (a newer attempt, a
/// resolution already made) stands.
pub(crate) async fn keep_known_outcome(
    store: &dyn Store,
    fence: &Fence,
    completion: Completion,
    refused: &oncely_core::TransitionError,
) {
    let current = store.get(&fence.id).await;
    let unknown_here = matches!(&current, Ok(Some(r))
        if r.state == oncely_core::State::OutcomeUnknown && r.attempt == fence.attempt);
    if !unknown_here {
        tracing::error!(target: "oncely::store", record = %fence.id, attempt = fence.attempt,
            error = %refused, "could not complete the record");
        return;
    }
    let reason = "its owner recorded the answer after the record was marked outcome_unknown \
                  (the ledger was away from the owner past its lease)";
    // The replay window the upstream asked to end early still ends then.
    let window = match (completion.replay_until, store.now().await) {
        (Some(until), Ok(now)) => completion.window.min(now.until(until)),
        (Some(_), Err(_)) => Duration::ZERO,
        (None, _) => completion.window,
    };
    let resolution = oncely_core::Resolution::Completed {
        response: completion.response,
        window,
        reason: reason.into(),
    };
    match write("resolve", fence, || {
        store.resolve(&fence.id, resolution.clone())
    })
    .await
    {
        Ok(_) => tracing::warn!(target: "oncely::store", record = %fence.id,
            attempt = fence.attempt, "an action marked outcome_unknown was completed by its owner"),
        Err(e) => tracing::error!(target: "oncely::store", record = %fence.id,
            attempt = fence.attempt, error = %e, "could not keep the owner's answer"),
    }
}

pub(crate) fn log_write_failure(record: &Record, what: &str, e: &StoreError) {
    // Another owner took the record over, or the ledger stayed away for good: the record
    // is as that owner (or a later take-over) leaves it.
    tracing::error!(
        target: "oncely::store",
        record = %record.id,
        attempt = record.attempt,
        error = %e,
        "could not {what} the record"
    );
}
