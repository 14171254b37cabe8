//! The owner task: runs one upstream call on a task of its own (a client that goes away
//! cancels nothing), keeps its lease renewed on another task while it owns the record,
//! reads the whole answer at the upstream's pace (a caller that stops reading holds up
//! neither the recording nor the lease: the caller is fed from what was read), keeps up
//! to `max_response` of it, and records the outcome with the fencing token it claimed
//! with. A ledger write that fails is retried with backoff for as long as this owner
//! still owns the record, and the lease is renewed, by the `ledger` module.
//!
//! The caller's body ends only after the record is written (for an answer with a
//! `content-length`, its last chunk waits), so a client that has read the whole answer
//! and retries finds the record completed (`replayed`, not `joined`); a ledger that has
//! not taken the record within [`STORE_ANSWER`] no longer holds the answer back;
//! a route with `answer = "before_record"` ends it before the write instead (a crash in
//! between is a crash during the call: the record stays processing, and is taken over
//! by its class with the same downstream key).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use oncely_core::{
    Completion, Disposition, Fence, Record, StoredResponse, Timestamp, UpstreamResult,
};
use oncely_store::{Store, StoreError};
use tokio::sync::oneshot;
use tokio::time::timeout_at;

use crate::budget::{Budget, Reservation};
use crate::call::{
    GuardedCall, Head, UpstreamAnswer, UpstreamError, UpstreamFailure, UpstreamFuture,
};
use crate::ledger::{
    keep_known_outcome, log_write_failure, settle, write, Held, Lease, STORE_ANSWER,
};
use crate::stream::{CallerBody, FedChunk, Feed};
use crate::tasks::TaskToken;
use crate::BoxError;

/// Everything one owner task needs.
pub(crate) struct OwnerTask<H> {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) record: Record,
    pub(crate) fence: Fence,
    pub(crate) call: GuardedCall,
    pub(crate) upstream: UpstreamFuture<H>,
    pub(crate) head: oneshot::Sender<Head<H>>,
    pub(crate) token: TaskToken,
    pub(crate) budget: Arc<Budget>,
    /// This owner counted as running in this process until the task ends.
    pub(crate) held: Held,
}

struct InFlightGauge;

impl InFlightGauge {
    fn start() -> InFlightGauge {
        metrics::gauge!("oncely_in_flight").increment(1.0);
        InFlightGauge
    }
}

impl Drop for InFlightGauge {
    fn drop(&mut self) {
        metrics::gauge!("oncely_in_flight").decrement(1.0);
    }
}

/// What is kept of an answer for the record: its chunks as read (shared with the
/// caller's feed, not copied), charged to the in-flight budget.
struct Kept {
    chunks: Vec<Bytes>,
    len: u64,
    charge: Reservation,
}

pub(crate) async fn run<H: Send + 'static>(task: OwnerTask<H>) {
    let OwnerTask {
        store,
        record,
        fence,
        call,
        upstream,
        head,
        token,
        budget,
        held,
    } = task;
    let _token = token;
    let _held = held;
    let _gauge = InFlightGauge::start();
    // Renewed from its own task until the outcome is written (or the record is lost).
    let lease = Lease::start(store.clone(), fence.clone(), call.lease);
    let started = Instant::now();
    let mut deadline = tokio::time::Instant::now() + call.timeout;
    // One of the route's upstream slots, held until the answer is read. The wait for it
    // is not an upstream call: it has `timeout` of its own, and the upstream gets its
    // whole `timeout` from the moment a slot is taken.
    let slot = match &call.slots {
        None => Ok(None),
        Some(slots) => match timeout_at(deadline, slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            Ok(Err(_closed)) => {
                let why = "upstream unreachable: the route's concurrency limit is closed";
                Err((
                    why.to_string(),
                    UpstreamFailure::Unreachable(why.to_string()),
                ))
            }
            // Still waiting for one of the route's slots: nothing was sent.
            Err(_elapsed) => Err((
                format!(
                    "no upstream slot of the route came free within {:?}; nothing was sent",
                    call.timeout
                ),
                UpstreamFailure::Busy,
            )),
        },
    };
    let slot = match slot {
        Ok(slot) => slot,
        Err((why, failure)) => {
            drop(upstream);
            let settled = settle(
                &*store,
                &record,
                &fence,
                Disposition::Release,
                why,
                call.window,
            );
            failing(settled, &record, head, failure).await;
            return;
        }
    };
    if slot.is_some() {
        deadline = tokio::time::Instant::now() + call.timeout;
    }
    let answer = timeout_at(deadline, upstream).await;
    let answer = match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(UpstreamError::BeforeSend(msg))) => {
            observe(started);
            let why = format!("upstream unreachable: {msg}");
            let settled = settle(
                &*store,
                &record,
                &fence,
                Disposition::Release,
                why,
                call.window,
            );
            failing(settled, &record, head, UpstreamFailure::Unreachable(msg)).await;
            return;
        }
        Ok(Err(UpstreamError::AfterSend(msg))) => {
            let why = format!("upstream failed after the request was sent: {msg}");
            let d = call.class.dispose(UpstreamResult::LostAfterSend);
            observe(started);
            let settled = settle(&*store, &record, &fence, d, why, call.window);
            failing(settled, &record, head, UpstreamFailure::Lost(msg)).await;
            return;
        }
        Err(_elapsed) => {
            let why = format!("upstream did not answer within {:?}", call.timeout);
            let d = call.class.dispose(UpstreamResult::LostAfterSend);
            observe(started);
            let settled = settle(&*store, &record, &fence, d, why, call.window);
            failing(settled, &record, head, UpstreamFailure::Timeout).await;
            return;
        }
    };

    let UpstreamAnswer {
        status,
        head: passed_on,
        body,
        units,
        stored_headers,
        replay_until,
        replay_seconds,
        provider_request_id,
        classify,
        length,
    } = answer;
    let (tx, caller_body) = CallerBody::new(length);
    let mut tx = Some(tx);
    if head
        .send(Head::Answer {
            status,
            head: passed_on,
            body: caller_body,
        })
        .is_err()
    {
        // The caller is gone; the call is recorded all the same.
        tx = None;
    }

    // Read the whole body at the upstream's pace, keeping up to `max_response` of it and
    // feeding the caller from what was read.
    let mut kept = Some(Kept {
        chunks: Vec::new(),
        len: 0,
        charge: budget.empty(),
    });
    let mut lost: Option<String> = None;
    // A caller told the length has the whole answer with its last byte: that chunk waits
    // for the record (unless the call answers before it), as the body's end does.
    let hold_last = length.filter(|_| !call.answer_before_record);
    let mut fed = 0u64;
    let mut held: Option<Bytes> = None;
    let mut body = body;
    loop {
        let chunk: Bytes = match timeout_at(deadline, body.next()).await {
            Ok(None) => break,
            Ok(Some(Ok(data))) => data,
            Ok(Some(Err(e))) => {
                lost = Some(format!("upstream body broke off: {e}"));
                break;
            }
            Err(_elapsed) => {
                lost = Some(format!(
                    "upstream body did not finish within {:?}",
                    call.timeout
                ));
                break;
            }
        };
        if let Some(k) = &mut kept {
            let n = chunk.len() as u64;
            if k.len + n > call.max_response {
                kept = None;
            } else if !k.charge.grow(n) {
                tracing::warn!(
                    record = %record.id,
                    in_flight_bytes = budget.used(),
                    "answers in flight hold max_inflight_bytes: this answer is recorded without its body"
                );
                kept = None;
            } else {
                k.len += n;
                k.chunks.push(chunk.clone());
            }
        }
        if let Some(sender) = &tx {
            fed += chunk.len() as u64;
            if hold_last == Some(fed) {
                held = Some(chunk);
            } else if !feed(sender, &budget, chunk) {
                tx = None;
            }
        }
    }
    drop(body);
    drop(slot);
    observe(started);
    if call.answer_before_record && lost.is_none() {
        // The whole answer was read: the caller's body ends now, before the record is.
        tx = None;
    }

    match lost {
        Some(why) => {
            if let Some(sender) = &tx {
                let e: BoxError = why.clone().into();
                let _ = sender.send(Err(e));
            }
            let d = call.class.dispose(UpstreamResult::LostAfterSend);
            settle(&*store, &record, &fence, d, why, call.window).await;
        }
        None => {
            // What the ledger keeps of the answer: a stored response, or a release or an
            // `outcome_unknown` (by the class, or by the classifier), with its reason.
            let kept_as = match call.class.dispose(UpstreamResult::Answered(status)) {
                Disposition::Store => {
                    let kept = kept.map(|k| match k.chunks.as_slice() {
                        [one] => one.clone(),
                        chunks => {
                            let mut whole = Vec::with_capacity(k.len as usize);
                            for c in chunks {
                                whole.extend_from_slice(c);
                            }
                            Bytes::from(whole)
                        }
                    });
                    match (classify, kept) {
                        (Some(classify), Some(kept)) => classify(&kept).into_stored(),
                        (_, kept) => Ok(StoredResponse {
                            status,
                            headers: stored_headers,
                            body: kept,
                        }),
                    }
                }
                d => Err((d, format!("upstream answered {status}"))),
            };
            match kept_as {
                Ok(response) => {
                    let replay_until = replay_end(&*store, replay_until, replay_seconds).await;
                    let completion = Completion {
                        response,
                        units: units.unwrap_or(call.units),
                        window: call.window,
                        replay_until,
                        provider_request_id,
                        trace: call.trace.map(|t| t.to_string()),
                    };
                    let written = async {
                        let written = write("complete", &fence, || {
                            store.complete(&fence, completion.clone())
                        })
                        .await;
                        match written {
                            Ok(_) => {}
                            Err(StoreError::Transition(refused)) => {
                                keep_known_outcome(&*store, &fence, completion, &refused).await
                            }
                            Err(e) => log_write_failure(&record, "complete", &e),
                        }
                    };
                    recording(written, &mut tx, &mut held, &budget, &fence).await;
                }
                Err((d, why)) => {
                    let settled = settle(&*store, &record, &fence, d, why, call.window);
                    recording(settled, &mut tx, &mut held, &budget, &fence).await;
                }
            }
        }
    }
    drop(lease);
    end_after_record(tx, held, &budget);
}

/// Runs `write` (recording the outcome of a call whose answer was read whole). The
/// caller waits for it, but not for ever: a ledger that has not taken the outcome within
/// [`STORE_ANSWER`] (a full disk, a store away, retries under way) would otherwise keep
/// an answer from its caller for as long as the owner keeps trying. Then the caller gets
/// the rest of its answer at once, and the record follows when it can (a repeat meanwhile
/// finds it `processing` and waits, as for any call in flight).
async fn recording<T>(
    write: impl Future<Output = T>,
    tx: &mut Option<Feed>,
    held: &mut Option<Bytes>,
    budget: &Arc<Budget>,
    fence: &Fence,
) -> T {
    tokio::pin!(write);
    if tx.is_none() {
        return write.await;
    }
    tokio::select! {
        written = &mut write => written,
        () = tokio::time::sleep(STORE_ANSWER) => {
            tracing::warn!(target: "oncely::store", record = %fence.id, attempt = fence.attempt,
                "the ledger has not taken the outcome within {}s: its caller gets the answer \
                 now, the record follows", STORE_ANSWER.as_secs());
            end_after_record(tx.take(), held.take(), budget);
            write.await
        }
    }
}

/// Settles the record of a call that failed (`settle`) and tells the caller, who gets the
/// record as settled; but not after [`STORE_ANSWER`]: a ledger that has not taken the
/// release or the `outcome_unknown` by then (a store away, retries under way) would keep
/// the caller's error from it for as long as the owner keeps trying. Then the caller is
/// told with the record as it still stands (`processing`), and the write goes on.
async fn failing<H>(
    settled: impl Future<Output = Record>,
    record: &Record,
    head: oneshot::Sender<Head<H>>,
    failure: UpstreamFailure,
) {
    tokio::pin!(settled);
    let record = tokio::select! {
        record = &mut settled => record,
        () = tokio::time::sleep(STORE_ANSWER) => {
            tracing::warn!(target: "oncely::store", record = %record.id, attempt = record.attempt,
                "the ledger has not taken the failed call's outcome within {}s: its caller is \
                 told now, the record follows", STORE_ANSWER.as_secs());
            let _ = head.send(Head::Failed { record: Box::new(record.clone()), failure });
            settled.await;
            return;
        }
    };
    let _ = head.send(Head::Failed {
        record: Box::new(record),
        failure,
    });
}

/// Ends the caller's body once the answer is recorded: hands over the chunk held back
/// for it, if any, and drops the sender.
fn end_after_record(tx: Option<Feed>, held: Option<Bytes>, budget: &Arc<Budget>) {
    if let (Some(sender), Some(chunk)) = (&tx, held) {
        feed(sender, budget, chunk);
    }
    // Dropping the sender ends the caller's body, after the record was written.
    drop(tx);
}

/// Hands one chunk to the caller without waiting for it; false when the caller is gone,
/// or lags so far behind that what it has not read would overrun the in-flight budget
/// (then its body ends with an error and the answer is only recorded).
fn feed(sender: &Feed, budget: &Arc<Budget>, chunk: Bytes) -> bool {
    let Some(charge) = budget.reserve(chunk.len() as u64) else {
        let e: BoxError = "the caller read too slowly: its unread answer outgrew the gateway's \
                           max_inflight_bytes"
            .into();
        let _ = sender.send(Err(e));
        return false;
    };
    sender
        .send(Ok(FedChunk {
            bytes: chunk,
            _charge: Some(charge),
        }))
        .is_ok()
}

fn observe(started: Instant) {
    metrics::histogram!("oncely_upstream_seconds").record(started.elapsed().as_secs_f64());
}

/// The end of the replay window the upstream asked for, if any: the earlier of its
/// `until` and `seconds` from now (by the ledger's clock).
async fn replay_end(
    store: &dyn Store,
    until: Option<Timestamp>,
    seconds: Option<u64>,
) -> Option<Timestamp> {
    let from_seconds = match seconds {
        Some(s) => {
            let now = store.now().await.ok()?;
            Some(now.plus(Duration::from_secs(s)))
        }
        None => None,
    };
    match (until, from_seconds) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
