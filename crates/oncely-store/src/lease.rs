//! The one lease keeper: whoever holds a lease (a record's owner, a task's worker) renews
//! it every third of its length while the work runs, and sooner, with backoff, after a
//! renewal the store could not take, so that a short store outage does not let the lease
//! lapse while there is still time to renew it.

use std::future::Future;
use std::time::Duration;

use oncely_core::backoff;

use crate::StoreError;

/// The first pause before a failed renewal is tried again; it doubles up to
/// [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_millis(50);

/// The longest pause between two tries of a failed renewal (never longer than a third of
/// the lease).
pub const RETRY_MAX: Duration = Duration::from_secs(2);

/// Renews with `renew` every third of `lease` (on the monotonic clock) until the store
/// refuses a renewal for good (another holder took the lease over, or it is gone), and
/// returns that refusal; runs until dropped otherwise. A renewal that fails with
/// [`StoreError::Unavailable`] is reported to `failed` with the pause before the next
/// try, and tried again sooner than a third of the lease, with backoff.
pub async fn keep<F, Fut>(
    lease: Duration,
    mut renew: F,
    mut failed: impl FnMut(&StoreError, Duration),
) -> StoreError
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let every = (lease / 3).max(Duration::from_millis(10));
    let mut next = tokio::time::Instant::now() + every;
    let mut failures = 0u32;
    loop {
        tokio::time::sleep_until(next).await;
        match renew().await {
            Ok(()) => {
                failures = 0;
                next = tokio::time::Instant::now() + every;
            }
            Err(e @ StoreError::Unavailable(_)) => {
                let pause = backoff::exponential(RETRY_FIRST, failures, RETRY_MAX).min(every);
                failed(&e, pause);
                failures = failures.saturating_add(1);
                next = tokio::time::Instant::now() + pause;
            }
            Err(refused) => return refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn renews_every_third_sooner_after_a_failure_and_stops_when_refused() {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let mut pauses = Vec::new();
        let refused = keep(
            Duration::from_millis(30),
            move || {
                let n = c.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n {
                        0 => Ok(()),
                        1 | 2 => Err(StoreError::Unavailable("down".into())),
                        3 => Ok(()),
                        _ => Err(StoreError::Config("gone".into())),
                    }
                }
            },
            |_, pause| pauses.push(pause),
        )
        .await;
        assert!(matches!(refused, StoreError::Config(_)), "{refused}");
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        // Sooner than a third of the lease after a failure: never longer than it.
        assert_eq!(
            pauses,
            [Duration::from_millis(10), Duration::from_millis(10)]
        );
    }
}
