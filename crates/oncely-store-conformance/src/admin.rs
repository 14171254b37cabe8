//! The [`Admin`] section: expiry and purge, listing, principals kept apart, usage and
//! statements, secrets, reconciliation schedules. One concept, kept in one file: the
//! contract of one trait of `oncely_store`, a test a rule, as `admin_tests!` lists them
//! and a backend author reads them. The tests share only the crate's helpers; split by
//! operation, the files would mirror that list and no more.

use std::time::Duration;

use oncely_core::{Class, Resolution, Scope, State, TakeOverOutcome};
use oncely_store::{Admin, Ledger, ListFilter};

use crate::{completion, existing, owned, spec, Harness, LEASE, WINDOW};

/// Expiry frees the key: after the window a claim owns a new record; purge removes it.
pub async fn expiry_frees_the_key<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
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
pub async fn released_records_expire_with_their_window<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
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

/// An action whose owner's lease lapsed becomes outcome_unknown, never runs again.
pub async fn lapsed_action_becomes_outcome_unknown<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
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

/// One principal never reads another's record: the same client key under two principals
/// names two records, and neither's claim returns the other's response.
pub async fn principals_are_isolated<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
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
    assert_eq!(again_b.identity.principal, "bob");
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
pub async fn list_filters_newest_first<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
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
pub async fn repeats_and_usage<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
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
            let now = store.now().await.unwrap();
            let summed = |count, units| oncely_store::Repeat {
                at: now,
                kind: oncely_store::RepeatKind::Replayed,
                count,
                units,
            };
            store
                .record_repeats(&r.id, principal, &r.route, &[summed(2, 200)])
                .await
                .unwrap();
            store
                .record_repeats(&r.id, principal, &r.route, &[summed(1, 100)])
                .await
                .unwrap();
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
    // A period starts at the start of its hour: the next hour holds nothing yet.
    let next_hour = store.now().await.unwrap().plus(Duration::from_secs(3600));
    assert_eq!(store.usage(Some(next_hour)).await.unwrap().totals.fresh, 0);
    drop(processing);
}

/// Each repeat is kept with its time, kind and units, listed per principal oldest first
/// (capped, with exact totals), counted on the record, and, once purged with the record,
/// summed per route and hour.
pub async fn repeat_events_for_statements<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
    use oncely_store::{Repeat, RepeatKind};
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
            count: 1,
            units: 10,
        },
        Repeat {
            at: at(5),
            kind: RepeatKind::Replayed,
            count: 1,
            units: 10,
        },
        Repeat {
            at: at(9),
            kind: RepeatKind::Replayed,
            count: 1,
            units: 10,
        },
    ];
    let route = "POST /v1/render";
    store
        .record_repeats(&ids[0], "alice", route, &alice[..2])
        .await
        .unwrap();
    store
        .record_repeats(&ids[0], "alice", route, &alice[2..])
        .await
        .unwrap();
    store
        .record_repeats(
            &ids[1],
            "bob",
            route,
            &[Repeat {
                at: at(2),
                kind: RepeatKind::Replayed,
                count: 1,
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
    // A period starts at the start of its hour.
    let later = store
        .repeat_events("alice", Some(at(9)), 100)
        .await
        .unwrap();
    assert_eq!((later.listed.len(), later.total), (3, 3));
    let next_hour = store
        .repeat_events("alice", Some(at(3_600_000)), 100)
        .await
        .unwrap();
    assert_eq!((next_hour.listed.len(), next_hour.total), (0, 0));
    let bob = store.repeat_events("bob", None, 100).await.unwrap();
    assert_eq!((bob.total, bob.total_units, bob.listed.len()), (1, 3, 1));
    assert_eq!(
        store.repeat_events("carol", None, 100).await.unwrap().total,
        0
    );
    // The events go with their record's window: no longer listed, summed per route
    // and hour, the totals the same.
    h.advance(WINDOW + Duration::from_secs(1));
    assert_eq!(store.purge_expired().await.unwrap(), 2);
    let after = store.repeat_events("alice", None, 100).await.unwrap();
    assert!(after.listed.is_empty(), "{after:?}");
    assert_eq!((after.total, after.total_units), (3, 30));
    let older: (u64, u64, u64, u64) = after.older.iter().fold((0, 0, 0, 0), |t, h| {
        (
            t.0 + h.repeats,
            t.1 + h.repeat_units,
            t.2 + h.joined,
            t.3 + h.replayed,
        )
    });
    assert_eq!(older, (3, 30, 1, 2));
    assert!(after.older.iter().all(|h| h.route == route));
    let bob = store.repeat_events("bob", None, 100).await.unwrap();
    assert_eq!((bob.total, bob.total_units, bob.listed.len()), (1, 3, 0));
}

/// Many repeats in one write (a busy record's flush: hundreds of replays in one tally) are
/// all kept, in order, each with its own time, kind and units.
pub async fn many_repeat_events_in_one_write_are_all_kept<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
    use oncely_store::{Repeat, RepeatKind};
    let store = h.store().await;
    let r = owned(
        store
            .claim(&spec("dora", "d1", "{}", Class::Write, "o"))
            .await
            .unwrap(),
    );
    store
        .complete(&r.fence().unwrap(), completion("{}", 2))
        .await
        .unwrap();
    let t0 = store.now().await.unwrap();
    // 64 + 64 + 22: whole statements and a shorter last one, where a store batches.
    let events: Vec<Repeat> = (0..150u64)
        .map(|i| Repeat {
            at: t0.plus(Duration::from_millis(i)),
            kind: if i % 3 == 0 {
                RepeatKind::Joined
            } else {
                RepeatKind::Replayed
            },
            count: 1,
            units: i % 5,
        })
        .collect();
    store
        .record_repeats(&r.id, "dora", &r.route, &events)
        .await
        .unwrap();
    store
        .record_repeats(&r.id, "dora", &r.route, &events[..1])
        .await
        .unwrap();
    let units: u64 = events.iter().map(|e| e.units).sum::<u64>() + events[0].units;
    let record = store.get(&r.id).await.unwrap().unwrap();
    assert_eq!((record.repeats, record.repeat_units), (151, units));
    let all = store.repeat_events("dora", None, 1000).await.unwrap();
    assert_eq!((all.total, all.total_units), (151, units));
    let mut expected: Vec<_> = events.iter().map(|e| (e.at, e.kind, e.units)).collect();
    expected.insert(1, (events[0].at, events[0].kind, events[0].units));
    let seen: Vec<_> = all.listed.iter().map(|e| (e.at, e.kind, e.units)).collect();
    assert_eq!(seen, expected);
    assert!(all
        .listed
        .iter()
        .all(|e| e.record == r.id && e.route == "POST /v1/render"));
}

/// A secret is generated once and shared by every instance on the database.
pub async fn secrets_are_stable_and_shared<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
    let a = h.store().await;
    let s1 = a.secret("principal-key").await.unwrap();
    assert!(s1.len() >= 16);
    assert_eq!(a.secret("principal-key").await.unwrap(), s1);
    let b = h.second().await;
    assert_eq!(b.secret("principal-key").await.unwrap(), s1);
    assert_ne!(a.secret("other").await.unwrap(), s1);
    a.ping().await.unwrap();
}

/// The reconciliation schedule of an outcome_unknown record is kept in the ledger and
/// shared by instances: a compare and set, so that of two instances racing for one
/// attempt exactly one wins; it is `None` outside outcome_unknown, and a record that
/// leaves the state and comes back starts afresh.
pub async fn reconcile_schedule_is_shared_and_compared<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
    use oncely_store::ReconcileSchedule;
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

/// Usage outlives the records: what records and their repeats counted is the same before
/// and after the purge that deletes them (and after an expired key is renewed in place),
/// per principal and per route and hour; repeats written after their record was purged
/// are counted; the history's old hours go with `purge_usage`.
pub async fn usage_outlives_the_records<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
    use oncely_store::{Repeat, RepeatKind};
    let store = h.store().await;
    let mut done = Vec::new();
    for (principal, key, units) in [("erin", "e1", 5u64), ("erin", "e2", 7), ("finn", "f1", 1)] {
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
        done.push(r);
    }
    let now = store.now().await.unwrap();
    let repeat = |kind, units| Repeat {
        at: now,
        kind,
        count: 1,
        units,
    };
    store
        .record_repeats(
            &done[0].id,
            "erin",
            &done[0].route,
            &[
                repeat(RepeatKind::Joined, 5),
                repeat(RepeatKind::Replayed, 5),
            ],
        )
        .await
        .unwrap();
    let before = store.usage(None).await.unwrap();
    let hours_before = store.usage_by_hour(None).await.unwrap();
    assert_eq!(
        (before.totals.fresh, before.totals.fresh_units),
        (3, 13),
        "{before:?}"
    );
    assert_eq!((before.totals.repeats, before.totals.repeat_units), (2, 10));
    let erin: Vec<_> = hours_before
        .iter()
        .filter(|r| r.principal == "erin")
        .collect();
    assert_eq!(erin.len(), 1, "{hours_before:?}");
    assert_eq!(
        (
            erin[0].fresh,
            erin[0].fresh_units,
            erin[0].repeats,
            erin[0].joined
        ),
        (2, 12, 2, 1)
    );
    assert_eq!(erin[0].hour, oncely_store::hour_of(now));
    assert_eq!(erin[0].route, "POST /v1/render");

    h.advance(WINDOW + Duration::from_secs(1));
    assert_eq!(store.purge_expired().await.unwrap(), 3);
    assert!(store.list(&ListFilter::default()).await.unwrap().is_empty());
    assert_eq!(
        store.usage(None).await.unwrap(),
        before,
        "the purge changed usage"
    );
    assert_eq!(store.usage_by_hour(None).await.unwrap(), hours_before);
    // A second purge folds nothing again.
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert_eq!(store.usage(None).await.unwrap(), before);

    // Repeats flushed after their record was purged still count, once.
    store
        .record_repeats(
            &done[2].id,
            "finn",
            &done[2].route,
            &[repeat(RepeatKind::Replayed, 1)],
        )
        .await
        .unwrap();
    store.purge_expired().await.unwrap();
    let after = store.usage(None).await.unwrap();
    assert_eq!((after.totals.repeats, after.totals.repeat_units), (3, 11));
    assert_eq!(after.totals.fresh, 3);

    // An expired key claimed again: the first execution's count stays.
    let again = owned(
        store
            .claim(&spec("finn", "f1", "{}", Class::Write, "o2"))
            .await
            .unwrap(),
    );
    store
        .complete(&again.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap();
    let later = store.usage(None).await.unwrap();
    assert_eq!((later.totals.fresh, later.totals.fresh_units), (4, 14));
    h.advance(WINDOW + Duration::from_secs(1));
    let renewed = owned(
        store
            .claim(&spec("finn", "f1", "{}", Class::Write, "o3"))
            .await
            .unwrap(),
    );
    assert_eq!(
        store.usage(None).await.unwrap().totals.fresh,
        4,
        "the renewed record's first execution is still counted"
    );
    drop(renewed);

    // The history's hours before a time go; later ones stay (the first three executions
    // and the repeats are in the first hour, the second run of f1 a window later).
    let hour = oncely_store::hour_of(now);
    assert_eq!(store.purge_usage(hour).await.unwrap(), 0);
    assert_eq!(
        store
            .purge_usage(hour.plus(Duration::from_secs(3600)))
            .await
            .unwrap(),
        2,
        "erin's and finn's first hour"
    );
    let kept = store.usage(None).await.unwrap();
    assert_eq!((kept.totals.fresh, kept.totals.repeats), (1, 0), "{kept:?}");
}

/// Two instances purging at once while repeats keep arriving fold every count once.
pub async fn concurrent_purges_fold_each_count_once<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
    use oncely_store::{Repeat, RepeatKind};
    let (a, b) = (h.store().await, h.second().await);
    let mut ids = Vec::new();
    for n in 0..40u64 {
        let r = owned(
            a.claim(&spec("gail", &format!("g{n}"), "{}", Class::Write, "o"))
                .await
                .unwrap(),
        );
        a.complete(&r.fence().unwrap(), completion("{}", 2))
            .await
            .unwrap();
        ids.push((r.id, r.identity.route));
    }
    h.advance(WINDOW + Duration::from_secs(1));
    let now = a.now().await.unwrap();
    let mut tasks = Vec::new();
    for (i, (id, route)) in ids.iter().enumerate() {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (id, route) = (id.clone(), route.clone());
        tasks.push(tokio::spawn(async move {
            let r = Repeat {
                at: now,
                kind: RepeatKind::Replayed,
                count: 1,
                units: 2,
            };
            store
                .record_repeats(&id, "gail", &route, &[r])
                .await
                .unwrap();
        }));
        if i % 10 == 0 {
            let (a, b) = (a.clone(), b.clone());
            tasks.push(tokio::spawn(async move {
                a.purge_expired().await.unwrap();
            }));
            tasks.push(tokio::spawn(async move {
                b.purge_expired().await.unwrap();
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    a.purge_expired().await.unwrap();
    b.purge_expired().await.unwrap();
    let usage = a.usage(None).await.unwrap();
    assert_eq!(
        (
            usage.totals.fresh,
            usage.totals.fresh_units,
            usage.totals.repeats,
            usage.totals.repeat_units
        ),
        (40, 80, 40, 80)
    );
    assert_eq!(b.usage(None).await.unwrap(), usage);
}

/// A purge of more expired records than one step of a store takes deletes them all and
/// counts each once in usage (stores purge in steps, so that claims run in between), and
/// leaves the records and repeat events whose window has not ended.
pub async fn a_purge_larger_than_a_step_takes_every_record_once<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger + Admin,
{
    use oncely_store::{Repeat, RepeatKind};
    const EXPIRED: u64 = 2_345;
    let store = h.store().await;
    let fresh = |n: u64| {
        let store = store.clone();
        async move {
            let r = owned(
                store
                    .claim(&spec("hal", &format!("p{n}"), "{}", Class::Write, "o"))
                    .await
                    .unwrap(),
            );
            store
                .complete(&r.fence().unwrap(), completion("{}", 3))
                .await
                .unwrap();
            let now = store.now().await.unwrap();
            let repeat = Repeat {
                at: now,
                kind: RepeatKind::Replayed,
                count: 1,
                units: 3,
            };
            store
                .record_repeats(&r.id, "hal", &r.route, &[repeat])
                .await
                .unwrap();
        }
    };
    // Many at once, so that the stores' groups commit them together.
    let mut tasks = Vec::new();
    for n in 0..EXPIRED {
        tasks.push(tokio::spawn(fresh(n)));
        if tasks.len() == 200 {
            for t in tasks.drain(..) {
                t.await.unwrap();
            }
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    h.advance(WINDOW + Duration::from_secs(1));
    // One record still in its window.
    fresh(EXPIRED).await;
    assert_eq!(store.purge_expired().await.unwrap(), EXPIRED);
    let left = store.list(&ListFilter::default()).await.unwrap();
    assert_eq!(left.len(), 1, "only the record in its window is left");
    assert_eq!(left[0].key, format!("p{EXPIRED}"));
    let usage = store.usage(None).await.unwrap();
    let all = EXPIRED + 1;
    assert_eq!(
        (
            usage.totals.fresh,
            usage.totals.fresh_units,
            usage.totals.repeats,
            usage.totals.repeat_units
        ),
        (all, 3 * all, all, 3 * all)
    );
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert_eq!(store.usage(None).await.unwrap(), usage);
}
