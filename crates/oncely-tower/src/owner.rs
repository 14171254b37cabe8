//! The owner task: runs one upstream call on a task of its own (a client that goes away
//! cancels nothing), renews the lease every third of it while the call runs, streams the
//! answer to its caller while buffering up to `max_response`, and records the outcome
//! with the fencing token it claimed with.
//!
//! The caller's body ends only after the record is written, so a client that has read
//! the whole answer and retries finds the record completed (`replayed`, not `joined`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use oncely_core::{
    Completion, Disposition, Fence, Record, StoredResponse, Timestamp, UpstreamResult,
};
use oncely_store::{Store, StoreError};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{interval_at, timeout_at, MissedTickBehavior};

use crate::body::ChannelBody;
use crate::guard::{
    Classified, GuardedCall, TaskToken, UpstreamAnswer, UpstreamError, UpstreamFailure,
};
use crate::problem::{REPLAY_SECONDS, REPLAY_UNTIL};
use crate::{BoxBody, BoxError};

/// Chunks in flight between the owner task and its caller.
const CHANNEL_CHUNKS: usize = 16;

/// What the owner tells its caller first.
pub(crate) enum Head {
    /// The upstream answered; the body follows through the channel.
    Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: BoxBody,
    },
    /// No answer: the record as the failure left it.
    Failed {
        record: Box<Record>,
        failure: UpstreamFailure,
    },
}

/// Everything one owner task needs.
pub(crate) struct OwnerTask {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) record: Record,
    pub(crate) fence: Fence,
    pub(crate) call: GuardedCall,
    pub(crate) upstream: BoxFuture<'static, Result<UpstreamAnswer, UpstreamError>>,
    pub(crate) head: oneshot::Sender<Head>,
    pub(crate) token: TaskToken,
}

/// Keeps the lease alive: renews every third of it.
struct Lease {
    store: Arc<dyn Store>,
    fence: Fence,
    lease: Duration,
    ticks: tokio::time::Interval,
}

impl Lease {
    fn new(store: Arc<dyn Store>, fence: Fence, lease: Duration) -> Lease {
        let every = (lease / 3).max(Duration::from_millis(10));
        let mut ticks = interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Lease {
            store,
            fence,
            lease,
            ticks,
        }
    }

    async fn tick(&mut self) {
        self.ticks.tick().await;
        if let Err(e) = self.store.renew(&self.fence, self.lease).await {
            // A fenced renewal means another owner took over: this call runs on, but its
            // result will be refused by the store.
            tracing::warn!(record = %self.fence.id, attempt = self.fence.attempt, error = %e, "lease renewal failed");
        }
    }
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

pub(crate) async fn run(task: OwnerTask) {
    let OwnerTask {
        store,
        record,
        fence,
        call,
        mut upstream,
        head,
        token,
    } = task;
    let _token = token;
    let _gauge = InFlightGauge::start();
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + call.timeout;
    let mut lease = Lease::new(store.clone(), fence.clone(), call.lease);

    let answer = loop {
        tokio::select! {
            r = timeout_at(deadline, &mut upstream) => break r,
            _ = lease.tick() => {}
        }
    };
    let answer = match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(UpstreamError::BeforeSend(msg))) => {
            let record = settle(
                &*store,
                &record,
                &fence,
                Disposition::Release,
                format!("upstream unreachable: {msg}"),
                call.window,
            )
            .await;
            observe(started);
            let _ = head.send(Head::Failed {
                record: Box::new(record),
                failure: UpstreamFailure::Unreachable(msg),
            });
            return;
        }
        Ok(Err(UpstreamError::AfterSend(msg))) => {
            let why = format!("upstream failed after the request was sent: {msg}");
            let d = call.class.dispose(UpstreamResult::LostAfterSend);
            let record = settle(&*store, &record, &fence, d, why, call.window).await;
            observe(started);
            let _ = head.send(Head::Failed {
                record: Box::new(record),
                failure: UpstreamFailure::Lost(msg),
            });
            return;
        }
        Err(_elapsed) => {
            let why = format!("upstream did not answer within {:?}", call.timeout);
            let d = call.class.dispose(UpstreamResult::LostAfterSend);
            let record = settle(&*store, &record, &fence, d, why, call.window).await;
            observe(started);
            let _ = head.send(Head::Failed {
                record: Box::new(record),
                failure: UpstreamFailure::Timeout,
            });
            return;
        }
    };

    let UpstreamAnswer {
        status,
        headers,
        body,
        units,
        classify,
    } = answer;
    let length = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (tx, caller_body) = ChannelBody::new(CHANNEL_CHUNKS, length);
    let mut tx = Some(tx);
    if head
        .send(Head::Answer {
            status,
            headers: headers.clone(),
            body: BoxBody::new(caller_body),
        })
        .is_err()
    {
        // The caller is gone; the call is recorded all the same.
        tx = None;
    }

    // Stream the body to the caller while keeping up to `max_response` of it.
    let mut kept: Option<Vec<u8>> = Some(Vec::new());
    let mut lost: Option<String> = None;
    let mut body = body;
    loop {
        let frame = tokio::select! {
            f = timeout_at(deadline, body.frame()) => f,
            _ = lease.tick() => continue,
        };
        let chunk: Bytes = match frame {
            Ok(None) => break,
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => data,
                Err(_trailers) => continue,
            },
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
        if let Some(buf) = &mut kept {
            if (buf.len() + chunk.len()) as u64 <= call.max_response {
                buf.extend_from_slice(&chunk);
            } else {
                kept = None;
            }
        }
        if let Some(sender) = &tx {
            if !forward(sender, chunk, deadline).await {
                tx = None;
            }
        }
    }
    observe(started);

    match lost {
        Some(why) => {
            if let Some(sender) = &tx {
                let e: BoxError = why.clone().into();
                let _ = sender.try_send(Err(e));
            }
            let d = call.class.dispose(UpstreamResult::LostAfterSend);
            settle(&*store, &record, &fence, d, why, call.window).await;
        }
        None => match call
            .class
            .dispose(UpstreamResult::Answered(status.as_u16()))
        {
            Disposition::Store => {
                let response = match (classify, kept) {
                    (Some(classify), Some(kept)) => classify(status, &headers, &kept),
                    (_, kept) => Classified::Store(StoredResponse {
                        status: status.as_u16(),
                        headers: crate::headers::replayable_headers(&headers),
                        body: kept,
                    }),
                };
                let response = match response {
                    Classified::Store(response) => response,
                    Classified::Release(why) => {
                        settle(
                            &*store,
                            &record,
                            &fence,
                            Disposition::Release,
                            why,
                            call.window,
                        )
                        .await;
                        drop(tx);
                        return;
                    }
                };
                let replay_until = replay_until(&*store, &headers).await;
                let completion = Completion {
                    response,
                    units: units.unwrap_or(call.units),
                    window: call.window,
                    replay_until,
                    provider_request_id: provider_request_id(&headers),
                };
                if let Err(e) = store.complete(&fence, completion).await {
                    log_write_failure(&record, "complete", &e);
                }
            }
            d => {
                let why = format!("upstream answered {}", status.as_u16());
                settle(&*store, &record, &fence, d, why, call.window).await;
            }
        },
    }
    // Dropping the sender ends the caller's body, after the record was written.
    drop(tx);
}

/// Sends one chunk to the caller; false when the caller is gone or stopped reading
/// until the deadline (then the answer is only recorded).
async fn forward(
    sender: &mpsc::Sender<Result<Bytes, BoxError>>,
    chunk: Bytes,
    deadline: tokio::time::Instant,
) -> bool {
    let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
    sender.send_timeout(Ok(chunk), wait).await.is_ok()
}

fn observe(started: Instant) {
    metrics::histogram!("oncely_upstream_seconds").record(started.elapsed().as_secs_f64());
}

/// Releases or marks unknown (never stores); returns the record as written, or as it was
/// when the store refused.
async fn settle(
    store: &dyn Store,
    record: &Record,
    fence: &Fence,
    disposition: Disposition,
    why: String,
    window: Duration,
) -> Record {
    let result = match disposition {
        Disposition::OutcomeUnknown => store.mark_unknown(fence, why).await,
        Disposition::Release | Disposition::Store => store.release(fence, Some(why), window).await,
    };
    match result {
        Ok(r) => r,
        Err(e) => {
            log_write_failure(record, "settle", &e);
            record.clone()
        }
    }
}

fn log_write_failure(record: &Record, what: &str, e: &StoreError) {
    // The record stays processing; its lease lapses and another owner takes it over.
    tracing::error!(
        target: "oncely::store",
        record = %record.id,
        attempt = record.attempt,
        error = %e,
        "could not {what} the record"
    );
}

/// The end of the replay window the upstream asked for, if any.
async fn replay_until(store: &dyn Store, headers: &HeaderMap) -> Option<Timestamp> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let until = text(REPLAY_UNTIL).and_then(|t| Timestamp::parse_rfc3339(t).ok());
    let seconds = text(REPLAY_SECONDS).and_then(|t| t.trim().parse::<u64>().ok());
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

fn provider_request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("request-id")
        .or_else(|| headers.get("x-request-id"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}
