//! The delivery worker: leases queued webhook deliveries and posts them to `deliver_to`.
//!
//! Each delivery is a `POST` of the original body with the original `Content-Type` and
//! `Idempotency-Key: EVENT_ID`, bounded by the webhook's `deliver_timeout`. A 2xx answer
//! finishes it (the task and its body are deleted); any other answer, a connection
//! failure or a timeout schedules a retry at a random time in
//! `[0, retry_backoff * 2^(attempt-1)]` (full jitter, the ceiling capped at one hour), and
//! after `max_attempts` the delivery is dead-lettered (see the `ops` module).
//!
//! The store's queue makes this safe with many workers: a task is leased to one worker at
//! a time (PostgreSQL: `FOR UPDATE SKIP LOCKED`), the worker renews its lease every third
//! of it while the delivery runs, and a worker that dies mid-delivery leaves its task to
//! be leased again about one lease later. The handler may therefore receive an event more
//! than once, always with the same `Idempotency-Key`. A worker whose store is away when
//! the delivery ends keeps its lease and retries recording the outcome (`finish`), so a
//! delivery answered is not sent again only because the store was away at its end.
//!
//! The worker wakes at once when this process's ingress queues an event ([`Waker`]) and
//! polls every `poll_interval` for retries that come due and other instances' tasks.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use oncely_core::backoff;
use oncely_http::client::{error_chain, ClientOptions, PooledClient};
use oncely_store::queue::while_leased;
use oncely_store::{Finished, Store, StoreError, Task, TaskOutcome};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::queue::{Waker, TASK_KIND};

/// The longest retry delay ceiling.
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// The trace of each delivery attempt (the gateway's are OpenTelemetry client spans in
/// the trace of the request that received the event). [`DeliverySpans::start`] is called
/// as an attempt is sent, with its headers (holding the trace context stored with the
/// delivery, which it may replace with its own span's); the closure it returns gets the
/// handler's status, or why no answer came. Dropped uncalled, the attempt timed out.
pub trait DeliverySpans: Send + Sync + std::fmt::Debug {
    /// Starts the span of one attempt to `target`.
    fn start(&self, headers: &mut http::HeaderMap, target: &str) -> DeliveryEnd;
}

/// How a delivery attempt's span ends: with the status, or why no answer came.
pub type DeliveryEnd = Box<dyn FnOnce(Result<u16, &str>) + Send>;

/// How the worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// This worker's name in the queue (unique per instance).
    pub owner: String,
    /// Deliveries in flight at once.
    pub concurrency: usize,
    /// How long a lease lasts without renewal (the worker renews it every third of it
    /// while a delivery runs). A worker that dies leaves its deliveries to others after
    /// this.
    pub lease: Duration,
    /// How often to look for due tasks without a wake-up.
    pub poll_interval: Duration,
    /// How long [`DeliveryWorker::stop`] waits for deliveries in flight.
    pub drain_timeout: Duration,
    /// The spans of deliveries, when traces are on.
    pub spans: Option<Arc<dyn DeliverySpans>>,
}

impl Default for WorkerOptions {
    fn default() -> WorkerOptions {
        WorkerOptions {
            owner: format!("worker-{}-{}", std::process::id(), rand::random::<u32>()),
            concurrency: 16,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(30),
            spans: None,
        }
    }
}

/// A running delivery worker. Stop it with [`DeliveryWorker::stop`].
#[derive(Debug)]
pub struct DeliveryWorker {
    waker: Waker,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

type HttpClient = PooledClient<Full<Bytes>>;

impl DeliveryWorker {
    /// Starts delivering the store's webhook tasks (on the current tokio runtime).
    pub fn start(store: Arc<dyn Store>, options: WorkerOptions) -> DeliveryWorker {
        DeliveryWorker::start_trusting(store, options, None)
    }

    /// Starts delivering, trusting the PEM certificates of `extra_ca` (the config's
    /// `upstream_ca`) for `https://` targets besides the system's roots and
    /// `$ONCELY_EXTRA_CA_FILE`.
    pub fn start_trusting(
        store: Arc<dyn Store>,
        options: WorkerOptions,
        extra_ca: Option<&Path>,
    ) -> DeliveryWorker {
        let waker = Waker::default();
        let (stop, stopped) = watch::channel(false);
        // The gateway's one upstream client (`oncely_http::client`): `deliver_to` may be
        // `https://` too, verified against the same roots as every upstream.
        let client_options = ClientOptions {
            connect_timeout: Some(Duration::from_secs(10)),
            ..ClientOptions::with_extra_ca(extra_ca)
        };
        let client: HttpClient = oncely_http::client::upstream_client_or_warn(&client_options);
        let run = Run {
            store,
            options,
            client,
            waker: waker.clone(),
        };
        let handle = tokio::spawn(run.run(stopped));
        DeliveryWorker {
            waker,
            stop,
            handle,
        }
    }

    /// The handle the ingress uses to wake this worker.
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// Stops leasing, lets deliveries in flight finish (up to `drain_timeout`), then
    /// returns. Deliveries cut off are leased again by a worker after their lease.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.handle.await;
    }

    /// Stops at once, abandoning deliveries in flight (as if the process died): their
    /// tasks are leased again after their lease lapses.
    pub fn abort(self) {
        self.handle.abort();
    }
}

struct Run {
    store: Arc<dyn Store>,
    options: WorkerOptions,
    client: HttpClient,
    waker: Waker,
}

impl Run {
    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let mut inflight: JoinSet<()> = JoinSet::new();
        let concurrency = this.options.concurrency.max(1);
        let mut reported: Option<Instant> = None;
        loop {
            if *stopped.borrow() {
                break;
            }
            while inflight.try_join_next().is_some() {}
            let free = concurrency.saturating_sub(inflight.len());
            let mut full_batch = false;
            if free > 0 {
                match this
                    .store
                    .lease_tasks(TASK_KIND, &this.options.owner, free, this.options.lease)
                    .await
                {
                    Ok(tasks) => {
                        full_batch = tasks.len() == free;
                        for task in tasks {
                            let this = Arc::clone(&this);
                            inflight.spawn(async move { this.deliver(task).await });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot lease webhook deliveries");
                    }
                }
                // The gauge costs a count query: at most once per poll interval.
                if reported.is_none_or(|at| at.elapsed() >= this.options.poll_interval) {
                    this.report_depth().await;
                    reported = Some(Instant::now());
                }
            }
            if full_batch {
                continue;
            }
            tokio::select! {
                _ = this.waker.notified() => {}
                _ = tokio::time::sleep(this.options.poll_interval) => {}
                Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
                _ = stopped.changed() => {}
            }
        }
        let drained = tokio::time::timeout(this.options.drain_timeout, async {
            while inflight.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                abandoned = inflight.len(),
                "webhook deliveries still running at stop are left to their lease"
            );
            inflight.abort_all();
        }
    }

    async fn report_depth(&self) {
        if let Ok(counts) = self.store.task_counts(TASK_KIND).await {
            metrics::gauge!("oncely_webhook_queue_depth", "state" => "pending")
                .set(counts.pending as f64);
            metrics::gauge!("oncely_webhook_queue_depth", "state" => "running")
                .set(counts.running as f64);
            metrics::gauge!("oncely_webhook_queue_depth", "state" => "dead")
                .set(counts.dead as f64);
        }
    }

    async fn deliver(&self, task: Task) {
        let Some(fence) = task.fence() else { return };
        let event_id = task.header("idempotency-key").unwrap_or("").to_string();
        let timeout = task.timeout;
        let started = Instant::now();
        let result = while_leased(
            &*self.store,
            &fence,
            self.options.lease,
            tokio::time::timeout(timeout, self.send(&task)),
        )
        .await;
        let error = match result {
            Ok(Ok(status)) if (200..300).contains(&status) => None,
            Ok(Ok(status)) => Some(format!("the handler answered {status}")),
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!(
                "the handler did not answer within {} ms",
                timeout.as_millis()
            )),
        };
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let outcome = match &error {
            None => TaskOutcome::Done,
            Some(error) => {
                let delay = backoff_delay(task.backoff, task.attempts);
                let now = match self.store.now().await {
                    Ok(now) => now,
                    Err(e) => {
                        tracing::warn!(task = %task.id, error = %e, "cannot schedule a retry; the lease will");
                        return;
                    }
                };
                TaskOutcome::Retry {
                    at: now.plus(delay),
                    error: error.clone(),
                }
            }
        };
        let record = task
            .record
            .as_ref()
            .map(|r| r.to_string())
            .unwrap_or_default();
        match while_leased(
            &*self.store,
            &fence,
            self.options.lease,
            finish(&*self.store, &fence, outcome),
        )
        .await
        {
            Ok(Finished::Done) => {
                metrics::counter!("oncely_webhook_deliveries_total", "result" => "delivered")
                    .increment(1);
                tracing::info!(
                    task = %task.id, record, event_id, attempt = task.attempts,
                    target = %task.target, duration_ms = elapsed_ms,
                    state = "delivered", "webhook delivered"
                );
            }
            Ok(Finished::Retrying(at)) => {
                metrics::counter!("oncely_webhook_deliveries_total", "result" => "retried")
                    .increment(1);
                tracing::info!(
                    task = %task.id, record, event_id, attempt = task.attempts,
                    max_attempts = task.max_attempts, target = %task.target,
                    error = error.as_deref().unwrap_or(""), next_at = %at.to_rfc3339(),
                    state = "retry_scheduled", "webhook delivery failed; retry scheduled"
                );
            }
            Ok(Finished::Dead) => {
                metrics::counter!("oncely_webhook_deliveries_total", "result" => "dead")
                    .increment(1);
                tracing::warn!(
                    task = %task.id, record, event_id, attempt = task.attempts,
                    target = %task.target, error = error.as_deref().unwrap_or(""),
                    state = "dead_lettered", "webhook delivery dead-lettered"
                );
            }
            Err(e) => {
                tracing::warn!(
                    task = %task.id, event_id, attempt = task.attempts, error = %e,
                    "webhook delivery result not recorded (lease lost?)"
                );
            }
        }
    }

    /// Sends one attempt; gives the status, or why no answer came.
    async fn send(&self, task: &Task) -> Result<u16, String> {
        let method = Method::from_bytes(task.method.as_bytes())
            .map_err(|_| format!("bad method {:?}", task.method))?;
        let mut request = Request::builder()
            .method(method)
            .uri(&task.target)
            .body(Full::new(Bytes::from(task.body.clone())))
            .map_err(|e| format!("bad delivery target {:?}: {e}", task.target))?;
        for (name, value) in &task.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                request.headers_mut().append(n, v);
            }
        }
        let end = self
            .options
            .spans
            .as_ref()
            .map(|s| s.start(request.headers_mut(), &task.target));
        let response = match self.client.request(request).await {
            Ok(r) => r,
            Err(e) => {
                let why = format!("cannot reach the handler: {}", error_chain(&e));
                if let Some(end) = end {
                    end(Err(&why));
                }
                return Err(why);
            }
        };
        let status = response.status().as_u16();
        if let Some(end) = end {
            end(Ok(status));
        }
        // Read (and drop) the answer so the connection can be reused.
        let _ = response.into_body().collect().await;
        Ok(status)
    }
}

/// The delay before the retry after `attempt` failed: uniform in
/// `[0, min(base * 2^(attempt-1), 1 h)]` (`oncely_core::backoff`, with full jitter).
pub fn backoff_delay(base: Duration, attempt: u32) -> Duration {
    backoff::full_jitter(backoff_ceiling(base, attempt), rand::random())
}

/// `min(base * 2^(attempt-1), 1 h)`.
pub fn backoff_ceiling(base: Duration, attempt: u32) -> Duration {
    backoff::exponential(base, attempt.saturating_sub(1), MAX_BACKOFF)
}

/// Records a delivery's outcome, trying again while the store is away (keeping the lease
/// meanwhile): a delivery whose outcome was never recorded is sent again once its lease
/// lapses. Gives up on a refusal (the task was leased again) or after [`FINISH_RETRY_FOR`].
async fn finish(
    store: &dyn Store,
    fence: &oncely_store::TaskFence,
    outcome: TaskOutcome,
) -> oncely_store::Result<Finished> {
    let give_up = Instant::now() + FINISH_RETRY_FOR;
    let mut failures = 0u32;
    loop {
        match store.finish_task(fence, outcome.clone()).await {
            Err(e @ StoreError::Unavailable(_)) if Instant::now() < give_up => {
                let pause = backoff::exponential(
                    Duration::from_millis(100),
                    failures,
                    Duration::from_secs(5),
                );
                tracing::warn!(task = %fence.id, attempt = fence.attempt, error = %e,
                    retry_in_ms = pause.as_millis() as u64,
                    "cannot record the delivery's outcome; retrying");
                tokio::time::sleep(pause).await;
                failures = failures.saturating_add(1);
            }
            other => return other,
        }
    }
}

/// How long a worker keeps trying to record a delivery's outcome while the store is away.
const FINISH_RETRY_FOR: Duration = Duration::from_secs(3600);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_full_jitter_and_a_cap() {
        let base = Duration::from_secs(1);
        assert_eq!(backoff_ceiling(base, 1), Duration::from_secs(1));
        assert_eq!(backoff_ceiling(base, 2), Duration::from_secs(2));
        assert_eq!(backoff_ceiling(base, 4), Duration::from_secs(8));
        assert_eq!(backoff_ceiling(base, 13), MAX_BACKOFF);
        assert_eq!(backoff_ceiling(base, 40), MAX_BACKOFF);
        let mut seen_low = false;
        for _ in 0..200 {
            let d = backoff_delay(base, 3);
            assert!(d <= Duration::from_secs(4));
            seen_low |= d < Duration::from_secs(2);
        }
        assert!(seen_low, "full jitter reaches below half the ceiling");
    }
}
