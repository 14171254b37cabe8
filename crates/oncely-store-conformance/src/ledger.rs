//! The [`Ledger`] section: atomic claims under contention, completion and replay, release and
//! reclaim, fencing of stale owners, lease renewal, reconciliation out of `outcome_unknown`.

use std::collections::HashSet;
use std::time::Duration;

use oncely_core::{Class, Resolution, State, StoredResponse, TakeOverOutcome, TransitionError};
use oncely_store::{Claim, Ledger, StoreError};

use crate::{completion, existing, owned, spec, Harness, LEASE, WINDOW};

/// A first claim owns a new processing record; a second gets that record unchanged.
pub async fn claim_new_then_existing<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let first = owned(
        store
            .claim(&spec("alice", "k1", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    assert_eq!(first.state, State::Processing);
    assert_eq!(first.attempt, 1);
    assert_eq!(first.owner.as_deref(), Some("a"));
    assert!(first.lease_until.is_some());
    let second = existing(
        store
            .claim(&spec("alice", "k1", "{}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    assert_eq!(second.id, first.id);
    assert_eq!(
        second.owner.as_deref(),
        Some("a"),
        "the second claimant does not become owner"
    );
    assert_eq!(store.get(&first.id).await.unwrap().unwrap(), second);
    assert_eq!(
        store.lookup(&first.scope, "k1").await.unwrap().unwrap().id,
        first.id
    );
    assert_eq!(store.lookup(&first.scope, "nope").await.unwrap(), None);
}

/// 200 concurrent claims of one key: exactly one owner, all others see its record.
pub async fn concurrent_claims_have_one_owner<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store
                .claim(&spec(
                    "alice",
                    "hot",
                    "{\"n\":1}",
                    Class::Write,
                    &format!("owner-{i}"),
                ))
                .await
                .unwrap()
        }));
    }
    let mut owners = 0;
    let mut ids = HashSet::new();
    let mut owner_name = None;
    for t in tasks {
        match t.await.unwrap() {
            Claim::Owned(r) => {
                owners += 1;
                owner_name = r.owner.clone();
                ids.insert(r.id);
            }
            Claim::Existing(r) => {
                ids.insert(r.id);
            }
        }
    }
    assert_eq!(owners, 1, "exactly one of 200 claimants owns the record");
    assert_eq!(ids.len(), 1, "every claimant sees the same record");
    let id = ids.into_iter().next().unwrap();
    assert_eq!(store.get(&id).await.unwrap().unwrap().owner, owner_name);
}

/// Concurrent claims from two instances on one database: still one owner.
pub async fn concurrent_claims_across_instances_have_one_owner<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let a = h.store().await;
    let b = h.second().await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            store
                .claim(&spec(
                    "alice",
                    "split",
                    "{}",
                    Class::Write,
                    &format!("o{i}"),
                ))
                .await
                .unwrap()
        }));
    }
    let mut owners = 0;
    for t in tasks {
        if let Claim::Owned(_) = t.await.unwrap() {
            owners += 1;
        }
    }
    assert_eq!(owners, 1);
}

/// A completed record keeps the response byte for byte, and is what a repeat gets.
pub async fn complete_then_replay<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let body = "{\"audio\":\"https://x/a.mp3\",\"bytes\":\"\u{0}\u{ff}\"}";
    let done = store
        .complete(&r.fence().unwrap(), completion(body, 42))
        .await
        .unwrap();
    assert_eq!(done.state, State::Completed);
    assert!(done.completed_at.is_some());
    let again = existing(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    assert_eq!(again.state, State::Completed);
    let resp = again.response.clone().unwrap();
    assert_eq!(resp.status, 201);
    assert_eq!(resp.body.as_deref(), Some(body.as_bytes()));
    assert_eq!(
        resp.headers,
        vec![
            ("content-type".to_string(), "application/json".to_string()),
            ("x-render-id".to_string(), "r-9".to_string())
        ]
    );
    assert_eq!(again.units, 42);
    assert_eq!(again.provider_request_id.as_deref(), Some("req_123"));
    assert_eq!(again.workflow_id.as_deref(), Some("wf-1"));
    let now = store.now().await.unwrap();
    assert!(again.is_replayable(now));
    let expires = again.expires_at.unwrap();
    let window_ms = expires.0 - again.completed_at.unwrap().0;
    assert_eq!(window_ms, WINDOW.as_millis() as i64);
    // A record completed without its body (over max_response) keeps that fact.
    let r2 = owned(
        store
            .claim(&spec("alice", "big", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let mut c = completion("", 1);
    c.response.body = None;
    store.complete(&r2.fence().unwrap(), c).await.unwrap();
    let big = store.get(&r2.id).await.unwrap().unwrap();
    assert_eq!(big.response.unwrap().body, None);
}

/// An owner's transition retried after its answer was lost (it was written) is answered
/// with the record as written, not refused and not written again; another attempt's
/// still is refused.
pub async fn a_retried_transition_is_answered_as_written<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "retried", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let fence = r.fence().unwrap();
    let done = store
        .complete(&fence, completion("{\"first\":true}", 3))
        .await
        .unwrap();
    let again = store
        .complete(&fence, completion("{\"second\":true}", 5))
        .await
        .expect("the retried completion is answered");
    assert_eq!(again.state, State::Completed);
    assert_eq!(
        again.response, done.response,
        "the retry wrote another answer"
    );
    assert_eq!(again.units, 3);
    assert_eq!(again.completed_at, done.completed_at);
    let mut stale = fence.clone();
    stale.attempt += 1;
    assert!(matches!(
        store.complete(&stale, completion("{}", 1)).await,
        Err(StoreError::Transition(TransitionError::Fenced { .. }))
    ));
    assert!(matches!(
        store.release(&fence, None, WINDOW).await,
        Err(StoreError::Transition(TransitionError::WrongState {
            state: State::Completed,
            ..
        }))
    ));

    let u = owned(
        store
            .claim(&spec("alice", "unknown", "{}", Class::Action, "a"))
            .await
            .unwrap(),
    );
    let fence = u.fence().unwrap();
    let first = store.mark_unknown(&fence, "timeout".into()).await.unwrap();
    let again = store.mark_unknown(&fence, "timeout".into()).await.unwrap();
    assert_eq!(again.state, State::OutcomeUnknown);
    assert_eq!(again.updated_at, first.updated_at);

    let l = owned(
        store
            .claim(&spec("alice", "released", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let fence = l.fence().unwrap();
    let first = store.release(&fence, None, WINDOW).await.unwrap();
    let again = store.release(&fence, None, WINDOW).await.unwrap();
    assert_eq!(again.state, State::Released);
    assert_eq!(again.expires_at, first.expires_at);
}

/// The upstream can shorten the window (`Oncely-Replay-Until`); never lengthen it.
pub async fn replay_until_shortens_the_window<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let now = store.now().await.unwrap();
    let mut c = completion("{}", 1);
    c.replay_until = Some(now.plus(Duration::from_secs(60)));
    let done = store.complete(&r.fence().unwrap(), c).await.unwrap();
    assert!(done.expires_at.unwrap() <= now.plus(Duration::from_secs(61)));
    h.advance(Duration::from_secs(61));
    let renewed = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    assert_ne!(
        renewed.id, r.id,
        "a new intention after the window gets a new record"
    );
    assert_eq!(renewed.attempt, 1);
}

pub async fn release_then_reclaim<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let released = store
        .release(&r.fence().unwrap(), Some("upstream 502".into()), WINDOW)
        .await
        .unwrap();
    assert_eq!(released.state, State::Released);
    assert_eq!(released.last_error.as_deref(), Some("upstream 502"));
    let again = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    assert_eq!(again.id, r.id);
    assert_eq!(again.attempt, 2);
    assert_eq!(again.owner.as_deref(), Some("b"));
    // The first owner's fence is stale now.
    let err = store
        .complete(&r.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Transition(TransitionError::Fenced { .. })),
        "{err:?}"
    );
    // A different body under the released key is not run: the caller answers 422.
    let other = existing(
        store
            .claim(&spec("alice", "k", "{\"x\":1}", Class::Write, "c"))
            .await
            .unwrap(),
    );
    assert_eq!(other.id, r.id);
}

/// A stale owner's complete is refused after a take-over; the new owner's goes through.
pub async fn stale_owner_refused_after_take_over<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let stale = r.fence().unwrap();
    let early = store.take_over(&r.id, 1, "b", LEASE).await.unwrap_err();
    assert!(
        matches!(
            early,
            StoreError::Transition(TransitionError::LeaseHeld { .. })
        ),
        "{early:?}"
    );
    h.advance(LEASE + Duration::from_secs(1));
    let TakeOverOutcome::Owned(taken) = store.take_over(&r.id, 1, "b", LEASE).await.unwrap() else {
        panic!("a write is executed again after its owner's lease lapsed")
    };
    assert_eq!(taken.attempt, 2);
    assert_eq!(taken.owner.as_deref(), Some("b"));
    // A second taker that saw attempt 1 loses.
    let lost = store.take_over(&r.id, 1, "c", LEASE).await.unwrap_err();
    assert!(
        matches!(lost, StoreError::Transition(TransitionError::Fenced { .. })),
        "{lost:?}"
    );
    for err in [
        store
            .complete(&stale, completion("{\"stale\":true}", 1))
            .await
            .unwrap_err(),
        store.release(&stale, None, WINDOW).await.unwrap_err(),
        store.mark_unknown(&stale, "x".into()).await.unwrap_err(),
    ] {
        assert!(
            matches!(
                err,
                StoreError::Transition(TransitionError::Fenced { attempt: 1, .. })
            ),
            "{err:?}"
        );
    }
    assert!(store.renew(&stale, LEASE).await.is_err());
    let done = store
        .complete(&taken.fence().unwrap(), completion("{\"fresh\":true}", 1))
        .await
        .unwrap();
    assert_eq!(
        done.response.unwrap().body.as_deref(),
        Some(&b"{\"fresh\":true}"[..])
    );
    let err = store
        .complete(&stale, completion("{}", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Transition(TransitionError::Fenced { .. })),
        "{err:?}"
    );
}

/// Renewal keeps a live owner's claim: no take-over while it renews.
pub async fn renew_keeps_the_lease<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    h.advance(LEASE - Duration::from_secs(5));
    store.renew(&r.fence().unwrap(), LEASE).await.unwrap();
    h.advance(Duration::from_secs(10));
    let err = store.take_over(&r.id, 1, "b", LEASE).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Transition(TransitionError::LeaseHeld { .. })
        ),
        "{err:?}"
    );
    let rec = store.get(&r.id).await.unwrap().unwrap();
    assert!(!rec.lease_lapsed(store.now().await.unwrap()));
}

/// Resolve out of outcome_unknown, both ways; refused from any other state.
pub async fn resolve_out_of_outcome_unknown<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let a = owned(
        store
            .claim(&spec("alice", "a", "{}", Class::Action, "o"))
            .await
            .unwrap(),
    );
    let b = owned(
        store
            .claim(&spec("alice", "b", "{}", Class::Action, "o"))
            .await
            .unwrap(),
    );
    let err = store
        .resolve(
            &a.id,
            Resolution::Released {
                window: std::time::Duration::from_secs(3600),
                reason: "op".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Transition(TransitionError::WrongState {
                state: State::Processing,
                ..
            })
        ),
        "{err:?}"
    );
    let unknown = store
        .mark_unknown(&a.fence().unwrap(), "timeout after send".into())
        .await
        .unwrap();
    assert_eq!(unknown.state, State::OutcomeUnknown);
    store
        .mark_unknown(&b.fence().unwrap(), "reset".into())
        .await
        .unwrap();

    let released = store
        .resolve(
            &a.id,
            Resolution::Released {
                window: std::time::Duration::from_secs(3600),
                reason: "supplier has no order".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(released.state, State::Released);
    let rerun = owned(
        store
            .claim(&spec("alice", "a", "{}", Class::Action, "p"))
            .await
            .unwrap(),
    );
    assert_eq!(
        rerun.attempt, 2,
        "after a release the next identical request executes afresh"
    );

    let completed = store
        .resolve(
            &b.id,
            Resolution::Completed {
                response: StoredResponse {
                    status: 200,
                    headers: vec![],
                    body: Some(bytes::Bytes::from_static(b"{\"order\":7}")),
                },
                window: WINDOW,
                reason: "supplier confirms order 7".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(completed.state, State::Completed);
    let replay = existing(
        store
            .claim(&spec("alice", "b", "{}", Class::Action, "p"))
            .await
            .unwrap(),
    );
    assert_eq!(
        replay.response.unwrap().body.as_deref(),
        Some(&b"{\"order\":7}"[..])
    );
    let err = store
        .resolve(
            &b.id,
            Resolution::Released {
                window: std::time::Duration::from_secs(3600),
                reason: "x".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Transition(TransitionError::WrongState {
                state: State::Completed,
                ..
            })
        ),
        "{err:?}"
    );
    let missing = store
        .resolve(
            &oncely_store::new_record_id(),
            Resolution::Released {
                window: std::time::Duration::from_secs(3600),
                reason: "x".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(missing, StoreError::NotFound(_)), "{missing:?}");
}
