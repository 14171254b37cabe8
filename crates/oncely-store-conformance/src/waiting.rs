//! The [`Waiting`] section: `wait_for` wakes as soon as the record is written, on this
//! instance or another, and times out.

use std::time::{Duration, Instant};

use oncely_core::{Class, State};
use oncely_store::{Ledger, StoreError, Waiting};

use crate::{completion, owned, spec, Harness};

/// A waiter wakes as soon as the record leaves processing; at the deadline otherwise.
pub async fn wait_for_wakes_and_times_out<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Waiting,
{
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let started = Instant::now();
    let still = store
        .wait_for(&r.id, Duration::from_millis(150))
        .await
        .unwrap();
    assert_eq!(still.state, State::Processing);
    assert!(started.elapsed() >= Duration::from_millis(140));

    let waiter = {
        let store = store.clone();
        let id = r.id.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let rec = store.wait_for(&id, Duration::from_secs(10)).await.unwrap();
            (rec, t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    store
        .complete(&r.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap();
    let (rec, waited) = waiter.await.unwrap();
    assert_eq!(rec.state, State::Completed);
    assert!(
        waited < Duration::from_secs(2),
        "woken, not timed out: {waited:?}"
    );
    // A settled record returns at once.
    let t = Instant::now();
    store
        .wait_for(&r.id, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_millis(500));
    let missing = store
        .wait_for(&oncely_store::new_record_id(), Duration::from_millis(10))
        .await
        .unwrap_err();
    assert!(matches!(missing, StoreError::NotFound(_)));
}

/// A waiter on a second instance of the same database wakes within 100 ms of the
/// completion made on the first.
pub async fn waiter_on_second_instance_wakes_quickly<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Waiting,
{
    let a = h.store().await;
    let b = h.second().await;
    for round in 0..3 {
        let r = owned(
            a.claim(&spec(
                "alice",
                &format!("x{round}"),
                "{}",
                Class::Write,
                "a",
            ))
            .await
            .unwrap(),
        );
        let waiter = {
            let b = b.clone();
            let id = r.id.clone();
            tokio::spawn(async move {
                let rec = b.wait_for(&id, Duration::from_secs(10)).await.unwrap();
                (rec, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let completed_at = Instant::now();
        a.complete(&r.fence().unwrap(), completion("{}", 1))
            .await
            .unwrap();
        let (rec, woke_at) = waiter.await.unwrap();
        assert_eq!(rec.state, State::Completed);
        let lag = woke_at.saturating_duration_since(completed_at);
        assert!(
            lag < Duration::from_millis(100),
            "round {round}: the second instance woke {lag:?} after the completion"
        );
    }
}
