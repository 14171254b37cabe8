//! The conformance suite: the same tests, run against every backend.
//!
//! A backend's test file implements [`Harness`] and calls [`conformance_tests!`]
//! (crate-level macro) to get one `#[tokio::test]` per rule:
//!
//! ```ignore
//! oncely_store::conformance_tests!(my_backend_harness());
//! ```
//!
//! Each test asserts one behaviour the ledger promises: atomic claims under contention,
//! fencing of stale owners, expiry, wake-ups across instances, reconciliation, and that
//! one principal never sees another's record.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use oncely_core::{
    ClaimSpec, Class, Completion, FingerprintBuilder, Resolution, Scope, State, StoredResponse,
    TakeOverOutcome, TransitionError,
};

use crate::queue::{Finished, NewTask, TaskCounts, TaskError, TaskOutcome, TaskState};
use crate::{Claim, ListFilter, Store, StoreError};

/// How the suite gets stores of one backend.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A store on a fresh, empty database, with a clock the harness can move.
    async fn store(&self) -> Arc<dyn Store>;
    /// A second, independent instance on the same database as the last [`Harness::store`]
    /// (another process would see it like this): its own connections and waiters.
    async fn second(&self) -> Arc<dyn Store>;
    /// Moves the clock of every store this harness made forward.
    fn advance(&self, by: Duration);
}

/// The lease used by the suite.
pub const LEASE: Duration = Duration::from_secs(30);
/// The replay window used by the suite.
pub const WINDOW: Duration = Duration::from_secs(3 * 3600);

/// A claim spec for `principal`'s `key` on route `POST /v1/render` with `body`.
pub fn spec(principal: &str, key: &str, body: &str, class: Class, owner: &str) -> ClaimSpec {
    let route = "POST /v1/render";
    ClaimSpec {
        scope: Scope::new(principal, route),
        key: key.to_string(),
        fingerprint: FingerprintBuilder::new(principal, "POST", "/v1/render")
            .body(body.as_bytes(), &[]),
        class,
        route: route.to_string(),
        principal: principal.to_string(),
        owner: owner.to_string(),
        lease: LEASE,
        workflow_id: Some("wf-1".into()),
    }
}

/// A completion with a small JSON body and one header.
pub fn completion(body: &str, units: u64) -> Completion {
    Completion {
        response: StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("x-render-id".into(), "r-9".into()),
            ],
            body: Some(bytes::Bytes::copy_from_slice(body.as_bytes())),
        },
        units,
        window: WINDOW,
        replay_until: None,
        provider_request_id: Some("req_123".into()),
    }
}

fn owned(c: Claim) -> oncely_core::Record {
    match c {
        Claim::Owned(r) => r,
        Claim::Existing(r) => panic!("expected to own the claim, found existing {r:?}"),
    }
}

fn existing(c: Claim) -> oncely_core::Record {
    match c {
        Claim::Existing(r) => r,
        Claim::Owned(r) => panic!("expected an existing record, the claim was granted: {r:?}"),
    }
}

/// A first claim owns a new processing record; a second gets that record unchanged.
pub async fn claim_new_then_existing(h: &dyn Harness) {
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
pub async fn concurrent_claims_have_one_owner(h: &dyn Harness) {
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
pub async fn concurrent_claims_across_instances_have_one_owner(h: &dyn Harness) {
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
pub async fn complete_then_replay(h: &dyn Harness) {
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

/// The upstream can shorten the window (`Oncely-Replay-Until`); never lengthen it.
pub async fn replay_until_shortens_the_window(h: &dyn Harness) {
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

/// Expiry frees the key: after the window a claim owns a new record; purge removes it.
pub async fn expiry_frees_the_key(h: &dyn Harness) {
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    store
        .complete(&r.fence().unwrap(), completion("{}", 5))
        .await
        .unwrap();
    let other = owned(
        store
            .claim(&spec("alice", "other", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    h.advance(WINDOW - Duration::from_secs(1));
    existing(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    assert_eq!(
        store.purge_expired().await.unwrap(),
        0,
        "nothing has expired yet"
    );
    h.advance(Duration::from_secs(2));
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert_eq!(
        store.get(&r.id).await.unwrap(),
        None,
        "the expired record is gone"
    );
    assert!(
        store.get(&other.id).await.unwrap().is_some(),
        "a processing record is never purged"
    );
    let fresh = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    assert_eq!(fresh.attempt, 1);
    // An expired record that was not purged yet is also renewed by a claim.
    store
        .complete(&fresh.fence().unwrap(), completion("{}", 5))
        .await
        .unwrap();
    h.advance(WINDOW + Duration::from_secs(1));
    let again = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "c"))
            .await
            .unwrap(),
    );
    assert_ne!(again.id, fresh.id);
    assert_eq!(again.repeats, 0);
}

/// A released record is executed again by the next identical claim: same id, attempt 2.
/// A released record expires with its window like a completed one: until then a
/// different body under its key is refused (the caller answers 422); after, that body
/// owns a new record, and purge removes expired released records.
pub async fn released_records_expire_with_their_window(h: &dyn Harness) {
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let released = store
        .release(&r.fence().unwrap(), Some("upstream 401".into()), WINDOW)
        .await
        .unwrap();
    assert!(released.expires_at.is_some(), "{released:?}");
    let flood = owned(
        store
            .claim(&spec("alice", "flood", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    store
        .release(&flood.fence().unwrap(), None, WINDOW)
        .await
        .unwrap();
    h.advance(WINDOW - Duration::from_secs(1));
    existing(
        store
            .claim(&spec("alice", "k", "{\"x\":1}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    assert_eq!(store.purge_expired().await.unwrap(), 0, "not expired yet");
    h.advance(Duration::from_secs(2));
    let fresh = owned(
        store
            .claim(&spec("alice", "k", "{\"x\":1}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    assert_ne!(fresh.id, r.id, "a new intention gets a new record");
    assert_eq!(fresh.attempt, 1);
    assert_eq!(fresh.expires_at, None);
    assert_eq!(
        store.purge_expired().await.unwrap(),
        1,
        "the other released record is purged"
    );
    assert_eq!(store.get(&flood.id).await.unwrap(), None);
    assert!(store.get(&fresh.id).await.unwrap().is_some());
}

pub async fn release_then_reclaim(h: &dyn Harness) {
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
pub async fn stale_owner_refused_after_take_over(h: &dyn Harness) {
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
pub async fn renew_keeps_the_lease(h: &dyn Harness) {
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

/// An action whose owner's lease lapsed becomes outcome_unknown, never runs again.
pub async fn lapsed_action_becomes_outcome_unknown(h: &dyn Harness) {
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("alice", "order", "{}", Class::Action, "a"))
            .await
            .unwrap(),
    );
    h.advance(LEASE + Duration::from_secs(1));
    let TakeOverOutcome::OutcomeUnknown(u) = store.take_over(&r.id, 1, "b", LEASE).await.unwrap()
    else {
        panic!("an action must not be executed again")
    };
    assert_eq!(u.state, State::OutcomeUnknown);
    assert!(u.last_error.is_some());
    let again = existing(
        store
            .claim(&spec("alice", "order", "{}", Class::Action, "c"))
            .await
            .unwrap(),
    );
    assert_eq!(again.state, State::OutcomeUnknown);
    h.advance(WINDOW * 4);
    assert_eq!(
        store.purge_expired().await.unwrap(),
        0,
        "outcome_unknown never expires by itself"
    );
    existing(
        store
            .claim(&spec("alice", "order", "{}", Class::Action, "c"))
            .await
            .unwrap(),
    );
}

/// Resolve out of outcome_unknown, both ways; refused from any other state.
pub async fn resolve_out_of_outcome_unknown(h: &dyn Harness) {
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
            &crate::new_record_id(),
            Resolution::Released {
                window: std::time::Duration::from_secs(3600),
                reason: "x".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(missing, StoreError::NotFound(_)), "{missing:?}");
}

/// A waiter wakes as soon as the record leaves processing; at the deadline otherwise.
pub async fn wait_for_wakes_and_times_out(h: &dyn Harness) {
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
        .wait_for(&crate::new_record_id(), Duration::from_millis(10))
        .await
        .unwrap_err();
    assert!(matches!(missing, StoreError::NotFound(_)));
}

/// A waiter on a second instance of the same database wakes within 100 ms of the
/// completion made on the first.
pub async fn waiter_on_second_instance_wakes_quickly(h: &dyn Harness) {
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

/// One principal never reads another's record: the same client key under two principals
/// names two records, and neither's claim returns the other's response.
pub async fn principals_are_isolated(h: &dyn Harness) {
    let store = h.store().await;
    let a = owned(
        store
            .claim(&spec("alice", "same-key", "{}", Class::Write, "o"))
            .await
            .unwrap(),
    );
    store
        .complete(&a.fence().unwrap(), completion("{\"for\":\"alice\"}", 3))
        .await
        .unwrap();
    let b = owned(
        store
            .claim(&spec("bob", "same-key", "{}", Class::Write, "o"))
            .await
            .unwrap(),
    );
    assert_ne!(a.id, b.id);
    assert_ne!(a.scope, b.scope);
    assert!(b.response.is_none());
    store
        .complete(&b.fence().unwrap(), completion("{\"for\":\"bob\"}", 3))
        .await
        .unwrap();
    let again_b = existing(
        store
            .claim(&spec("bob", "same-key", "{}", Class::Write, "o"))
            .await
            .unwrap(),
    );
    assert_eq!(
        again_b.response.unwrap().body.as_deref(),
        Some(&b"{\"for\":\"bob\"}"[..])
    );
    assert_eq!(again_b.principal, "bob");
    let again_a = existing(
        store
            .claim(&spec("alice", "same-key", "{}", Class::Write, "o"))
            .await
            .unwrap(),
    );
    assert_eq!(
        again_a.response.unwrap().body.as_deref(),
        Some(&b"{\"for\":\"alice\"}"[..])
    );
    let only_bob = store
        .list(&ListFilter {
            principal: Some("bob".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(only_bob.len(), 1);
    assert_eq!(only_bob[0].id, b.id);
    assert_eq!(
        store
            .lookup(&Scope::new("mallory", "POST /v1/render"), "same-key")
            .await
            .unwrap(),
        None
    );
}

/// Listing filters by state, principal and route, newest first.
pub async fn list_filters_newest_first(h: &dyn Harness) {
    let store = h.store().await;
    let mut ids = Vec::new();
    for i in 0..4 {
        let r = owned(
            store
                .claim(&spec("alice", &format!("k{i}"), "{}", Class::Write, "o"))
                .await
                .unwrap(),
        );
        ids.push(r.clone());
        h.advance(Duration::from_millis(5));
    }
    store
        .complete(&ids[0].fence().unwrap(), completion("{}", 1))
        .await
        .unwrap();
    store
        .release(&ids[1].fence().unwrap(), None, WINDOW)
        .await
        .unwrap();
    let all = store.list(&ListFilter::default()).await.unwrap();
    assert_eq!(
        all.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        ids.iter().rev().map(|r| r.id.clone()).collect::<Vec<_>>()
    );
    let processing = store
        .list(&ListFilter {
            state: Some(State::Processing),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(processing.len(), 2);
    assert!(processing.iter().all(|r| r.state == State::Processing));
    let completed = store
        .list(&ListFilter {
            state: Some(State::Completed),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].id, ids[0].id);
    let by_route = store
        .list(&ListFilter {
            route: Some("POST /v1/render".into()),
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_route.len(), 2);
    assert_eq!(by_route[0].id, ids[3].id);
    let none = store
        .list(&ListFilter {
            route: Some("GET /nothing".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(none.is_empty());
}

/// Repeats are counted per record and add up per principal in usage.
pub async fn repeats_and_usage(h: &dyn Harness) {
    let store = h.store().await;
    for (principal, key, units) in [
        ("alice", "a1", 100u64),
        ("alice", "a2", 50),
        ("bob", "b1", 7),
    ] {
        let r = owned(
            store
                .claim(&spec(principal, key, "{}", Class::Write, "o"))
                .await
                .unwrap(),
        );
        store
            .complete(&r.fence().unwrap(), completion("{}", units))
            .await
            .unwrap();
        if key == "a1" {
            store.add_repeats(&r.id, 2, 200).await.unwrap();
            store.add_repeats(&r.id, 1, 100).await.unwrap();
        }
    }
    let processing = owned(
        store
            .claim(&spec("carol", "c1", "{}", Class::Write, "o"))
            .await
            .unwrap(),
    );
    let a1 = store
        .lookup(&Scope::new("alice", "POST /v1/render"), "a1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((a1.repeats, a1.repeat_units), (3, 300));
    let usage = store.usage(None).await.unwrap();
    assert_eq!(usage.totals.fresh, 3);
    assert_eq!(usage.totals.fresh_units, 157);
    assert_eq!(usage.totals.repeats, 3);
    assert_eq!(usage.totals.repeat_units, 300);
    assert_eq!(
        usage.by_principal.len(),
        2,
        "only completed executions are charged: {usage:?}"
    );
    let alice = usage
        .by_principal
        .iter()
        .find(|r| r.principal == "alice")
        .unwrap();
    assert_eq!(
        (
            alice.fresh,
            alice.fresh_units,
            alice.repeats,
            alice.repeat_units
        ),
        (2, 150, 3, 300)
    );
    let bob = usage
        .by_principal
        .iter()
        .find(|r| r.principal == "bob")
        .unwrap();
    assert_eq!(
        (bob.fresh, bob.fresh_units, bob.repeats, bob.repeat_units),
        (1, 7, 0, 0)
    );
    let future = store.now().await.unwrap().plus(Duration::from_secs(60));
    assert_eq!(store.usage(Some(future)).await.unwrap().totals.fresh, 0);
    assert!(store
        .add_repeats(&crate::new_record_id(), 1, 1)
        .await
        .is_err());
    drop(processing);
}

/// Each repeat is kept with its time, kind and units, listed per principal oldest first
/// (capped, with exact totals), counted on the record like `add_repeats`, and purged with
/// the record.
pub async fn repeat_events_for_statements(h: &dyn Harness) {
    use crate::{Repeat, RepeatKind};
    let store = h.store().await;
    let mut ids = Vec::new();
    for (principal, key, units) in [("alice", "a1", 10u64), ("bob", "b1", 3)] {
        let r = owned(
            store
                .claim(&spec(principal, key, "{}", Class::Write, "o"))
                .await
                .unwrap(),
        );
        store
            .complete(&r.fence().unwrap(), completion("{}", units))
            .await
            .unwrap();
        ids.push(r.id);
    }
    let t0 = store.now().await.unwrap();
    let at = |ms: u64| t0.plus(Duration::from_millis(ms));
    let alice = [
        Repeat {
            at: at(1),
            kind: RepeatKind::Joined,
            units: 10,
        },
        Repeat {
            at: at(5),
            kind: RepeatKind::Replayed,
            units: 10,
        },
        Repeat {
            at: at(9),
            kind: RepeatKind::Replayed,
            units: 10,
        },
    ];
    store.record_repeats(&ids[0], &alice[..2]).await.unwrap();
    store.record_repeats(&ids[0], &alice[2..]).await.unwrap();
    store
        .record_repeats(
            &ids[1],
            &[Repeat {
                at: at(2),
                kind: RepeatKind::Replayed,
                units: 3,
            }],
        )
        .await
        .unwrap();
    let a1 = store.get(&ids[0]).await.unwrap().unwrap();
    assert_eq!((a1.repeats, a1.repeat_units), (3, 30));
    let all = store.repeat_events("alice", None, 100).await.unwrap();
    assert_eq!((all.total, all.total_units), (3, 30));
    let seen: Vec<_> = all.listed.iter().map(|e| (e.at, e.kind, e.units)).collect();
    assert_eq!(
        seen,
        alice
            .iter()
            .map(|r| (r.at, r.kind, r.units))
            .collect::<Vec<_>>()
    );
    assert!(all
        .listed
        .iter()
        .all(|e| e.record == ids[0] && e.route == "POST /v1/render"));
    let capped = store.repeat_events("alice", None, 1).await.unwrap();
    assert_eq!(
        (capped.listed.len(), capped.total, capped.total_units),
        (1, 3, 30)
    );
    assert_eq!(capped.listed[0].kind, RepeatKind::Joined);
    let later = store
        .repeat_events("alice", Some(at(5)), 100)
        .await
        .unwrap();
    assert_eq!((later.listed.len(), later.total), (2, 2));
    let bob = store.repeat_events("bob", None, 100).await.unwrap();
    assert_eq!((bob.total, bob.total_units, bob.listed.len()), (1, 3, 1));
    assert_eq!(
        store.repeat_events("carol", None, 100).await.unwrap().total,
        0
    );
    assert!(matches!(
        store
            .record_repeats(&crate::new_record_id(), &alice[..1])
            .await,
        Err(StoreError::NotFound(_))
    ));
    // The events go with their record's window.
    h.advance(WINDOW + Duration::from_secs(1));
    assert_eq!(store.purge_expired().await.unwrap(), 2);
    assert_eq!(
        store.repeat_events("alice", None, 100).await.unwrap().total,
        0
    );
    assert_eq!(
        store.repeat_events("bob", None, 100).await.unwrap().total,
        0
    );
}

/// A secret is generated once and shared by every instance on the database.
pub async fn secrets_are_stable_and_shared(h: &dyn Harness) {
    let a = h.store().await;
    let s1 = a.secret("principal-key").await.unwrap();
    assert!(s1.len() >= 16);
    assert_eq!(a.secret("principal-key").await.unwrap(), s1);
    let b = h.second().await;
    assert_eq!(b.secret("principal-key").await.unwrap(), s1);
    assert_ne!(a.secret("other").await.unwrap(), s1);
    a.ping().await.unwrap();
}

// The durable task queue.

/// A webhook-like task for the queue tests.
pub fn new_task(body: &str, max_attempts: u32) -> NewTask {
    NewTask {
        kind: "webhook".into(),
        target: "http://127.0.0.1:9/hook".into(),
        method: "POST".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("idempotency-key".into(), "evt_1".into()),
        ],
        body: body.as_bytes().to_vec(),
        max_attempts,
        timeout: Duration::from_secs(5),
        backoff: Duration::from_millis(10),
    }
}

fn webhook_spec(key: &str) -> ClaimSpec {
    spec("stripe", key, "{}", Class::Webhook, "ingress")
}

/// Enqueues one task under `key`; panics unless the claim was new.
async fn enqueue(store: &Arc<dyn Store>, key: &str, max_attempts: u32) -> crate::Task {
    let record = owned(
        store
            .claim_with_task(
                &[webhook_spec(key)],
                Some(completion("", 0)),
                new_task(&format!("{{\"key\":\"{key}\"}}"), max_attempts),
            )
            .await
            .unwrap(),
    );
    let tasks = store.list_tasks("webhook", None).await.unwrap();
    tasks
        .into_iter()
        .find(|t| t.record.as_ref() == Some(&record.id))
        .expect("the task of a new claim is queued")
}

/// A claim with a task is all or nothing: one existing claim means no record and no task.
pub async fn queue_claim_with_task_is_all_or_nothing(h: &dyn Harness) {
    let store = h.store().await;
    let held = owned(store.claim(&webhook_spec("a")).await.unwrap());
    let refused = existing(
        store
            .claim_with_task(
                &[webhook_spec("b"), webhook_spec("a")],
                Some(completion("", 0)),
                new_task("{}", 3),
            )
            .await
            .unwrap(),
    );
    assert_eq!(refused.id, held.id, "the existing claim is reported");
    assert_eq!(
        store.lookup(&held.scope, "b").await.unwrap(),
        None,
        "b not written"
    );
    assert!(store.list_tasks("webhook", None).await.unwrap().is_empty());

    let first = owned(
        store
            .claim_with_task(
                &[webhook_spec("b"), webhook_spec("c")],
                Some(completion("", 0)),
                new_task("{\"n\":1}", 3),
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        first.state,
        State::Completed,
        "completed with the completion"
    );
    let c = store
        .lookup(&held.scope, "c")
        .await
        .unwrap()
        .expect("c written");
    assert_eq!(c.state, State::Completed);
    let tasks = store.list_tasks("webhook", None).await.unwrap();
    assert_eq!(tasks.len(), 1);
    let t = &tasks[0];
    assert_eq!(t.record.as_ref(), Some(&first.id));
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!(t.attempts, 0);
    assert_eq!(t.max_attempts, 3);
    assert_eq!(t.body, b"{\"n\":1}");
    assert_eq!(t.header("Idempotency-Key"), Some("evt_1"));
    assert_eq!(t.timeout, Duration::from_secs(5));
    assert_eq!(t.backoff, Duration::from_millis(10));
    assert_eq!(store.get_task(&t.id).await.unwrap().as_ref(), Some(t));
    // Either spec alone is now a duplicate.
    existing(
        store
            .claim_with_task(&[webhook_spec("c")], None, new_task("{}", 3))
            .await
            .unwrap(),
    );
    assert_eq!(store.list_tasks("webhook", None).await.unwrap().len(), 1);
    // Without a completion the records stay processing, owned by their claimant.
    let job = owned(
        store
            .claim_with_task(&[webhook_spec("d")], None, new_task("{}", 3))
            .await
            .unwrap(),
    );
    assert_eq!(job.state, State::Processing);
    assert_eq!(job.owner.as_deref(), Some("ingress"));
    assert_eq!(
        store.task_counts("webhook").await.unwrap(),
        TaskCounts {
            pending: 2,
            running: 0,
            dead: 0
        }
    );
    assert_eq!(
        store.task_counts("job").await.unwrap(),
        TaskCounts::default()
    );
}

/// 100 concurrent claims of one event id over two instances: one record, one task.
pub async fn queue_concurrent_claims_enqueue_once(h: &dyn Harness) {
    let a = h.store().await;
    let b = h.second().await;
    let mut joins = Vec::new();
    for i in 0..100 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        joins.push(tokio::spawn(async move {
            store
                .claim_with_task(
                    &[webhook_spec("evt_hot")],
                    Some(completion("", 0)),
                    new_task(&format!("{{\"i\":{i}}}"), 3),
                )
                .await
                .unwrap()
        }));
    }
    let mut owners = 0;
    let mut ids = HashSet::new();
    for j in joins {
        let claim = j.await.unwrap();
        if matches!(claim, Claim::Owned(_)) {
            owners += 1;
        }
        ids.insert(claim.record().id.clone());
    }
    assert_eq!(owners, 1, "exactly one of 100 claims is new");
    assert_eq!(ids.len(), 1, "every claimant sees the same record");
    assert_eq!(a.list_tasks("webhook", None).await.unwrap().len(), 1);
}

/// Two instances leasing concurrently never get the same task.
pub async fn queue_concurrent_leases_never_share(h: &dyn Harness) {
    let a = h.store().await;
    let b = h.second().await;
    for i in 0..40 {
        enqueue(&a, &format!("e{i}"), 3).await;
    }
    let mut joins = Vec::new();
    for w in 0..6 {
        let store = if w % 2 == 0 { a.clone() } else { b.clone() };
        joins.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let leased = store
                    .lease_tasks("webhook", &format!("w{w}"), 3, LEASE)
                    .await
                    .unwrap();
                if leased.is_empty() {
                    return got;
                }
                for t in &leased {
                    assert_eq!(t.state, TaskState::Running);
                    assert_eq!(t.attempts, 1);
                    assert_eq!(t.owner.as_deref(), Some(format!("w{w}").as_str()));
                }
                got.extend(leased.into_iter().map(|t| t.id));
            }
        }));
    }
    let mut all = Vec::new();
    for j in joins {
        all.extend(j.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), 40, "each task leased exactly once: {all:?}");
    assert_eq!(unique.len(), 40);
    assert_eq!(
        a.task_counts("webhook").await.unwrap(),
        TaskCounts {
            pending: 0,
            running: 40,
            dead: 0
        }
    );
    assert!(a
        .lease_tasks("job", "w", 10, LEASE)
        .await
        .unwrap()
        .is_empty());
}

/// A lapsed lease is leased again with attempt + 1; the stale holder cannot finish it.
pub async fn queue_lapsed_lease_is_leased_again_and_fenced(h: &dyn Harness) {
    let store = h.store().await;
    let second = h.second().await;
    let t = enqueue(&store, "slow", 5).await;
    let first = store.lease_tasks("webhook", "w1", 10, LEASE).await.unwrap();
    assert_eq!(first.len(), 1);
    let stale = first[0].fence().unwrap();
    assert!(second
        .lease_tasks("webhook", "w2", 10, LEASE)
        .await
        .unwrap()
        .is_empty());
    h.advance(LEASE + Duration::from_secs(1));
    let again = second
        .lease_tasks("webhook", "w2", 10, LEASE)
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "the lapsed task is due again");
    assert_eq!(again[0].id, t.id);
    assert_eq!(again[0].attempts, 2);
    assert_eq!(again[0].body, t.body, "the same body");
    assert_eq!(again[0].header("idempotency-key"), Some("evt_1"));
    let err = store
        .finish_task(&stale, TaskOutcome::Done)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { attempt: 1, .. })),
        "{err:?}"
    );
    assert_eq!(store.get_task(&t.id).await.unwrap().unwrap().attempts, 2);
    let fence = again[0].fence().unwrap();
    assert_eq!(
        second.finish_task(&fence, TaskOutcome::Done).await.unwrap(),
        Finished::Done
    );
    assert_eq!(
        store.get_task(&t.id).await.unwrap(),
        None,
        "done tasks are deleted"
    );
    let err = second
        .finish_task(&fence, TaskOutcome::Done)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { .. })),
        "{err:?}"
    );
}

/// The reconciliation schedule of an outcome_unknown record is kept in the ledger and
/// shared by instances: a compare and set, so that of two instances racing for one
/// attempt exactly one wins; it is `None` outside outcome_unknown, and a record that
/// leaves the state and comes back starts afresh.
pub async fn reconcile_schedule_is_shared_and_compared(h: &dyn Harness) {
    use crate::ReconcileSchedule;
    let store = h.store().await;
    let second = h.second().await;
    let a = owned(
        store
            .claim(&spec("alice", "rs", "{}", Class::Action, "o"))
            .await
            .unwrap(),
    );
    assert_eq!(store.reconcile_schedule(&a.id).await.unwrap(), None);
    let fresh = ReconcileSchedule::default();
    let held = |n: u32, at: i64| ReconcileSchedule {
        attempts: n,
        next_at: Some(oncely_core::Timestamp(at)),
    };
    assert!(
        !store
            .schedule_reconcile(&a.id, fresh, held(1, 10))
            .await
            .unwrap(),
        "no schedule while processing"
    );
    store
        .mark_unknown(&a.fence().unwrap(), "timeout after send".into())
        .await
        .unwrap();
    assert_eq!(store.reconcile_schedule(&a.id).await.unwrap(), Some(fresh));
    // Ten instances race for attempt 1: one wins.
    let racers: Vec<_> = (0..10)
        .map(|i| {
            let s = if i % 2 == 0 {
                store.clone()
            } else {
                second.clone()
            };
            let id = a.id.clone();
            tokio::spawn(async move {
                s.schedule_reconcile(&id, fresh, held(1, 1_000 + i))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut won = 0;
    for r in racers {
        won += usize::from(r.await.unwrap());
    }
    assert_eq!(won, 1, "one instance takes the attempt");
    let now = second.reconcile_schedule(&a.id).await.unwrap().unwrap();
    assert_eq!(now.attempts, 1, "the other instance sees it");
    assert!(
        !store
            .schedule_reconcile(&a.id, fresh, held(1, 5))
            .await
            .unwrap(),
        "a stale view is refused"
    );
    assert!(second
        .schedule_reconcile(&a.id, now, held(1, 99_000))
        .await
        .unwrap());
    assert_eq!(
        store.reconcile_schedule(&a.id).await.unwrap(),
        Some(held(1, 99_000))
    );
    // Released by reconciliation, reclaimed, unknown again: a new schedule.
    store
        .resolve(
            &a.id,
            Resolution::Released {
                window: std::time::Duration::from_secs(3600),
                reason: "404".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(store.reconcile_schedule(&a.id).await.unwrap(), None);
    h.advance(Duration::from_millis(5));
    let again = owned(
        store
            .claim(&spec("alice", "rs", "{}", Class::Action, "o2"))
            .await
            .unwrap(),
    );
    assert_eq!(again.id, a.id);
    h.advance(Duration::from_millis(5));
    store
        .mark_unknown(&again.fence().unwrap(), "reset".into())
        .await
        .unwrap();
    assert_eq!(
        second.reconcile_schedule(&a.id).await.unwrap(),
        Some(fresh),
        "a new stay in outcome_unknown starts afresh"
    );
}

/// A renewed task lease holds past its first term, on every instance and under the
/// shared cap; once renewals stop it lapses one lease later. A stale leaseholder cannot
/// renew.
pub async fn queue_renewed_lease_holds_then_lapses(h: &dyn Harness) {
    let store = h.store().await;
    let second = h.second().await;
    let t = enqueue(&store, "long", 5).await;
    let first = store.lease_tasks("webhook", "w1", 10, LEASE).await.unwrap();
    assert_eq!(first.len(), 1);
    let fence = first[0].fence().unwrap();
    for _ in 0..3 {
        h.advance(LEASE / 2);
        store.renew_task(&fence, LEASE).await.unwrap();
        assert!(
            second
                .lease_tasks("webhook", "w2", 10, LEASE)
                .await
                .unwrap()
                .is_empty(),
            "a renewed lease is not leased again"
        );
        assert!(
            second
                .lease_tasks_capped("webhook", "w2", 1, LEASE)
                .await
                .unwrap()
                .is_empty(),
            "a renewed lease holds its slot"
        );
    }
    let held = second.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!((held.state, held.attempts), (TaskState::Running, 1));
    h.advance(LEASE + Duration::from_secs(1));
    let again = second
        .lease_tasks("webhook", "w2", 10, LEASE)
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "without renewals the lease lapses");
    assert_eq!(again[0].attempts, 2);
    let err = store.renew_task(&fence, LEASE).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { attempt: 1, .. })),
        "{err:?}"
    );
    let fence = again[0].fence().unwrap();
    second.renew_task(&fence, LEASE).await.unwrap();
    second.finish_task(&fence, TaskOutcome::Done).await.unwrap();
    let err = second.renew_task(&fence, LEASE).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { .. })),
        "a finished task cannot be renewed: {err:?}"
    );
}

/// A retry waits for its time, then is leased with attempt + 1.
pub async fn queue_retry_schedules_next_at(h: &dyn Harness) {
    let store = h.store().await;
    let t = enqueue(&store, "flaky", 5).await;
    let leased = store.lease_tasks("webhook", "w", 1, LEASE).await.unwrap();
    let at = store.now().await.unwrap().plus(Duration::from_secs(10));
    let finished = store
        .finish_task(
            &leased[0].fence().unwrap(),
            TaskOutcome::Retry {
                at,
                error: "handler answered 500".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(finished, Finished::Retrying(at));
    let stored = store.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!(stored.state, TaskState::Pending);
    assert_eq!(stored.next_at, at);
    assert_eq!(stored.owner, None);
    assert_eq!(stored.last_error.as_deref(), Some("handler answered 500"));
    assert!(store
        .lease_tasks("webhook", "w", 1, LEASE)
        .await
        .unwrap()
        .is_empty());
    h.advance(Duration::from_secs(11));
    let again = store.lease_tasks("webhook", "w", 1, LEASE).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempts, 2);
}

/// After its last attempt a task is dead, keeps its body, and can be requeued.
pub async fn queue_dead_after_max_attempts_then_requeue(h: &dyn Harness) {
    let store = h.store().await;
    let t = enqueue(&store, "doomed", 2).await;
    for attempt in 1..=2 {
        h.advance(Duration::from_secs(1));
        let leased = store.lease_tasks("webhook", "w", 1, LEASE).await.unwrap();
        assert_eq!(leased.len(), 1);
        assert_eq!(leased[0].attempts, attempt);
        let at = store.now().await.unwrap();
        let finished = store
            .finish_task(
                &leased[0].fence().unwrap(),
                TaskOutcome::Retry {
                    at,
                    error: format!("attempt {attempt} failed"),
                },
            )
            .await
            .unwrap();
        let want = if attempt == 2 {
            Finished::Dead
        } else {
            Finished::Retrying(at)
        };
        assert_eq!(finished, want);
    }
    h.advance(Duration::from_secs(60));
    assert!(store
        .lease_tasks("webhook", "w", 1, LEASE)
        .await
        .unwrap()
        .is_empty());
    let dead = store
        .list_tasks("webhook", Some(TaskState::Dead))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, t.id);
    assert_eq!(dead[0].body, t.body, "a dead task keeps its body");
    assert_eq!(dead[0].last_error.as_deref(), Some("attempt 2 failed"));
    assert_eq!(store.task_counts("webhook").await.unwrap().dead, 1);
    assert!(store
        .list_tasks("webhook", Some(TaskState::Pending))
        .await
        .unwrap()
        .is_empty());

    let requeued = store.requeue_task(&t.id).await.unwrap();
    assert_eq!(requeued.state, TaskState::Pending);
    assert_eq!(requeued.attempts, 0);
    let err = store.requeue_task(&t.id).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::WrongState { .. })),
        "{err:?}"
    );
    let err = store
        .requeue_task(&crate::TaskId("task_nope".into()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::NotFound(_))),
        "{err:?}"
    );
    let leased = store.lease_tasks("webhook", "w", 1, LEASE).await.unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].attempts, 1);

    // A worker that dies on the last attempt leaves a dead task, not an endless loop.
    let one = enqueue(&store, "once", 1).await;
    let leased = store.lease_tasks("webhook", "w", 10, LEASE).await.unwrap();
    assert!(leased.iter().any(|l| l.id == one.id));
    h.advance(LEASE + Duration::from_secs(1));
    let again = store.lease_tasks("webhook", "w2", 10, LEASE).await.unwrap();
    assert!(
        again.iter().all(|l| l.id != one.id),
        "not leased a second time"
    );
    let stored = store.get_task(&one.id).await.unwrap().unwrap();
    assert_eq!(stored.state, TaskState::Dead);
    assert_eq!(
        stored.last_error.as_deref(),
        Some(crate::queue::LAPSED_ON_LAST_ATTEMPT)
    );
}

/// A capped lease never takes the running tasks of a kind over the cap, even when 20
/// capped leases race over two instances; finishing one frees one slot, and a running
/// task whose lease lapsed frees its slot (and is due again).
pub async fn queue_capped_leases_share_one_cap(h: &dyn Harness) {
    let a = h.store().await;
    let b = h.second().await;
    for i in 0..10 {
        enqueue(&a, &format!("cap{i}"), 5).await;
    }
    let mut joins = Vec::new();
    for i in 0..20 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        joins.push(tokio::spawn(async move {
            store
                .lease_tasks_capped("webhook", &format!("w{i}"), 3, LEASE)
                .await
                .unwrap()
        }));
    }
    let mut running = Vec::new();
    for j in joins {
        running.extend(j.await.unwrap());
    }
    assert_eq!(
        running.len(),
        3,
        "the cap holds across instances: {running:?}"
    );
    let ids: HashSet<_> = running.iter().map(|t| t.id.clone()).collect();
    assert_eq!(ids.len(), 3);
    assert!(b
        .lease_tasks_capped("webhook", "late", 3, LEASE)
        .await
        .unwrap()
        .is_empty());
    // Uncapped leases are not limited by it.
    assert_eq!(
        a.lease_tasks("webhook", "free", 2, LEASE)
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(a
        .lease_tasks_capped("webhook", "late", 5, LEASE)
        .await
        .unwrap()
        .is_empty());
    let done = running.pop().unwrap();
    a.finish_task(&done.fence().unwrap(), TaskOutcome::Done)
        .await
        .unwrap();
    let one = b
        .lease_tasks_capped("webhook", "next", 3, LEASE)
        .await
        .unwrap();
    assert!(one.is_empty(), "5 run under a cap of 3: {one:?}");
    let one = b
        .lease_tasks_capped("webhook", "next", 5, LEASE)
        .await
        .unwrap();
    assert_eq!(one.len(), 1, "one slot freed: {one:?}");
    // Every lease lapses: the running tasks are due again and hold no slot.
    h.advance(LEASE + Duration::from_secs(1));
    let again = a
        .lease_tasks_capped("webhook", "after", 4, LEASE)
        .await
        .unwrap();
    assert_eq!(again.len(), 4, "{again:?}");
    assert_eq!(
        a.task_counts("webhook").await.unwrap(),
        TaskCounts {
            pending: 0,
            running: 9,
            dead: 0
        },
        "the 4 pending tasks (due longest) were leased"
    );
}

/// A queued job's task (kind `job:...`) holding `body`.
fn job_task(body: &str) -> NewTask {
    NewTask {
        kind: "job:render".into(),
        target: "/v1/render".into(),
        method: "POST".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
        max_attempts: 1_000,
        timeout: Duration::from_secs(5),
        backoff: LEASE,
    }
}

fn job_spec(body: &str, owner: &str) -> ClaimSpec {
    spec("alice", "job-key", body, Class::Job, owner)
}

/// Leases the one due job task, checks that it belongs to `record`, and finishes it.
async fn run_job_task(store: &Arc<dyn Store>, record: &oncely_core::Record) {
    let leased = store
        .lease_tasks("job:render", "w", 10, LEASE)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "one job task is due: {leased:?}");
    assert_eq!(leased[0].record.as_ref(), Some(&record.id));
    let fence = leased[0].fence().unwrap();
    store.finish_task(&fence, TaskOutcome::Done).await.unwrap();
}

/// A failed (released) job is retried through the queue: the next identical
/// claim-with-task reclaims the record (same id, attempt + 1, so the same downstream key)
/// and queues its work again, once, even when 20 instances' claims race, replacing the
/// task its failed run's worker left unfinished; a different body under the key gets the
/// record, and a completed record past its window is renewed.
pub async fn queue_released_record_is_reclaimed_with_a_new_task(h: &dyn Harness) {
    let a = h.store().await;
    let b = h.second().await;
    let body = "{\"text\":\"hello\"}";
    let first = owned(
        a.claim_with_task(&[job_spec(body, "a")], None, job_task(body))
            .await
            .unwrap(),
    );
    // The worker records the release and stops before finishing its task.
    let leased = a.lease_tasks("job:render", "w", 10, LEASE).await.unwrap();
    assert_eq!(leased.len(), 1);
    let stale = leased[0].fence().unwrap();
    let released = a
        .release(&first.fence().unwrap(), Some("upstream 502".into()), WINDOW)
        .await
        .unwrap();
    assert_eq!(released.state, State::Released);
    assert_eq!(a.list_tasks("job:render", None).await.unwrap().len(), 1);

    // A different body under the released key is refused (the caller answers 422).
    let other = existing(
        a.claim_with_task(&[job_spec("{}", "x")], None, job_task("{}"))
            .await
            .unwrap(),
    );
    assert_eq!(other.id, first.id);
    assert_eq!(other.state, State::Released);
    assert_eq!(a.list_tasks("job:render", None).await.unwrap().len(), 1);

    // 20 identical retries over two instances: one reclaims, the rest get its record.
    let mut joins = Vec::new();
    for i in 0..20 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let owner = format!("retry-{i}");
        joins.push(tokio::spawn(async move {
            store
                .claim_with_task(&[job_spec(body, &owner)], None, job_task(body))
                .await
                .unwrap()
        }));
    }
    let mut reclaimed = Vec::new();
    for j in joins {
        match j.await.unwrap() {
            Claim::Owned(r) => reclaimed.push(r),
            Claim::Existing(r) => {
                assert_eq!(r.id, first.id);
                assert_eq!(r.state, State::Processing, "the retry's claim is seen");
            }
        }
    }
    assert_eq!(
        reclaimed.len(),
        1,
        "exactly one retry reclaims: {reclaimed:?}"
    );
    let again = reclaimed.pop().unwrap();
    assert_eq!(
        again.id, first.id,
        "the same record, so the same downstream key"
    );
    assert_eq!(again.attempt, 2);
    assert_eq!(again.state, State::Processing);
    assert_ne!(again.owner, first.owner);
    let tasks = a.list_tasks("job:render", None).await.unwrap();
    assert_eq!(tasks.len(), 1, "the retry is queued once: {tasks:?}");
    assert_eq!(tasks[0].record.as_ref(), Some(&first.id));
    assert_eq!(
        tasks[0].state,
        TaskState::Pending,
        "the new task, not the stale one"
    );
    assert_ne!(tasks[0].id, stale.id);
    let err = a.finish_task(&stale, TaskOutcome::Done).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Task(TaskError::Fenced { .. })),
        "{err:?}"
    );
    assert_eq!(tasks[0].body, body.as_bytes());
    assert_eq!(a.get(&first.id).await.unwrap().unwrap().attempt, 2);
    // The first run's fence is stale.
    let err = a
        .complete(&first.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Transition(TransitionError::Fenced { .. })),
        "{err:?}"
    );

    run_job_task(&b, &again).await;
    let done = b
        .complete(&again.fence().unwrap(), completion("{\"ok\":true}", 3))
        .await
        .unwrap();
    assert_eq!(done.state, State::Completed);
    // A completed job is replayed, not queued again.
    let replay = existing(
        b.claim_with_task(&[job_spec(body, "late")], None, job_task(body))
            .await
            .unwrap(),
    );
    assert_eq!(replay.id, first.id);
    assert_eq!(replay.state, State::Completed);
    assert!(a.list_tasks("job:render", None).await.unwrap().is_empty());

    // Past its window the key is a new intention: a new record and a new task.
    h.advance(WINDOW + Duration::from_secs(1));
    let renewed = owned(
        a.claim_with_task(&[job_spec(body, "next")], None, job_task(body))
            .await
            .unwrap(),
    );
    assert_ne!(renewed.id, first.id);
    assert_eq!(renewed.attempt, 1);
    assert_eq!(renewed.state, State::Processing);
    assert_eq!(
        a.get(&first.id).await.unwrap(),
        None,
        "the old row is replaced"
    );
    run_job_task(&a, &renewed).await;
}

/// Generates one `#[tokio::test]` per conformance rule for a harness expression.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@tests $harness;
            claim_new_then_existing,
            concurrent_claims_have_one_owner,
            concurrent_claims_across_instances_have_one_owner,
            complete_then_replay,
            replay_until_shortens_the_window,
            expiry_frees_the_key,
            released_records_expire_with_their_window,
            release_then_reclaim,
            stale_owner_refused_after_take_over,
            renew_keeps_the_lease,
            lapsed_action_becomes_outcome_unknown,
            resolve_out_of_outcome_unknown,
            reconcile_schedule_is_shared_and_compared,
            wait_for_wakes_and_times_out,
            waiter_on_second_instance_wakes_quickly,
            principals_are_isolated,
            list_filters_newest_first,
            repeats_and_usage,
            repeat_events_for_statements,
            secrets_are_stable_and_shared,
            queue_claim_with_task_is_all_or_nothing,
            queue_concurrent_claims_enqueue_once,
            queue_concurrent_leases_never_share,
            queue_lapsed_lease_is_leased_again_and_fenced,
            queue_renewed_lease_holds_then_lapses,
            queue_retry_schedules_next_at,
            queue_dead_after_max_attempts_then_requeue,
            queue_released_record_is_reclaimed_with_a_new_task,
            queue_capped_leases_share_one_cap,
        );
    };
    (@tests $harness:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let harness = $harness;
                $crate::conformance::$name(&harness).await;
            }
        )*
    };
}
