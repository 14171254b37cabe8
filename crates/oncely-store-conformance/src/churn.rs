//! The churn section (`oncely_store::churn`): a key made up for a retry joins another
//! key's record of the same fingerprint once that record's caller went away, names it from
//! then on, and stops doing so once an answer of it reached a caller; another instance on
//! the same database agrees.

use std::time::Duration;

use oncely_core::Class;
use oncely_store::churn::{self, Churn};
use oncely_store::{ChurnKind, Claim, Ledger};

use crate::{owned, spec, Harness, WINDOW};

const CHURN: Churn = Churn {
    window: Duration::from_secs(600),
    keep: WINDOW,
};

/// Joins, names, forgets; and a second instance sees what the first wrote.
pub async fn a_made_up_key_joins_an_undelivered_record<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let body = r#"{"sku": 1}"#;
    let original = owned(
        store
            .claim(&spec("alice", "k1", body, Class::Action, "a"))
            .await
            .unwrap(),
    );
    // Its caller waits: a new key with its body is a second intention.
    let (twin, _) = churn::claim(
        &*store,
        &spec("alice", "k0", body, Class::Action, "b"),
        CHURN,
        &|| false,
    )
    .await
    .unwrap();
    assert!(matches!(twin, Claim::Owned(_)), "{twin:?}");

    let now = store.now().await.unwrap();
    assert!(store
        .churn_put(&churn::undelivered(&original, CHURN, now))
        .await
        .unwrap());
    let other = h.second().await;
    for (n, s) in [("this", &store), ("another", &other)] {
        // Another instance learns of it (PostgreSQL: by notification).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !s
            .churn_filter()
            .is_some_and(|f| f.undelivered(&original.id))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} instance never learnt the record is undelivered"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (joined, first) = churn::claim(
        &*other,
        &spec("alice", "k2", body, Class::Action, "c"),
        CHURN,
        &|| false,
    )
    .await
    .unwrap();
    assert!(first, "joined now");
    assert!(
        matches!(&joined, Claim::Existing(r) if r.id == original.id),
        "{joined:?}"
    );
    let (again, first) = churn::claim(
        &*store,
        &spec("alice", "k2", body, Class::Action, "d"),
        CHURN,
        &|| false,
    )
    .await
    .unwrap();
    assert!(!first, "counted once");
    assert!(
        matches!(&again, Claim::Existing(r) if r.id == original.id),
        "{again:?}"
    );
    // Another principal's identical request is its own.
    let (theirs, _) = churn::claim(
        &*store,
        &spec("bob", "k9", body, Class::Action, "e"),
        CHURN,
        &|| false,
    )
    .await
    .unwrap();
    assert!(matches!(theirs, Claim::Owned(_)), "{theirs:?}");

    let entries = store.churn_of(&original.id).await.unwrap();
    let joined_keys: Vec<_> = entries
        .iter()
        .filter(|e| e.kind == ChurnKind::Joined)
        .filter_map(|e| e.key.as_deref())
        .collect();
    assert_eq!(joined_keys, ["k2"]);
    assert!(entries.iter().any(|e| e.kind == ChurnKind::Undelivered));

    // An answer reached a caller: a new key is a new intention; the joined one stays.
    store.churn_forget(&original.id).await.unwrap();
    let (third, _) = churn::claim(
        &*other,
        &spec("alice", "k3", body, Class::Action, "f"),
        CHURN,
        &|| false,
    )
    .await
    .unwrap();
    assert!(matches!(third, Claim::Owned(_)), "{third:?}");
    let (named, _) = churn::claim(
        &*other,
        &spec("alice", "k2", body, Class::Action, "g"),
        CHURN,
        &|| false,
    )
    .await
    .unwrap();
    assert!(
        matches!(&named, Claim::Existing(r) if r.id == original.id),
        "{named:?}"
    );
}

/// Past the window, an undelivered record is not joined.
pub async fn an_undelivered_record_past_the_window_is_not_joined<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let body = r#"{"sku": 2}"#;
    let original = owned(
        store
            .claim(&spec("alice", "k1", body, Class::Write, "a"))
            .await
            .unwrap(),
    );
    let now = store.now().await.unwrap();
    store
        .churn_put(&churn::undelivered(&original, CHURN, now))
        .await
        .unwrap();
    h.advance(CHURN.window + Duration::from_secs(1));
    let (late, first) = churn::claim(
        &*store,
        &spec("alice", "k2", body, Class::Write, "b"),
        CHURN,
        &|| false,
    )
    .await
    .unwrap();
    assert!(!first);
    assert!(matches!(late, Claim::Owned(_)), "{late:?}");
}

/// A released undelivered record (its attempt failed, and nobody heard of it) is claimed
/// again by a made-up key under the original's key: its next attempt, the same record.
pub async fn a_made_up_key_claims_a_released_undelivered_record_again<H: Harness + ?Sized>(h: &H)
where
    H::Store: Ledger,
{
    let store = h.store().await;
    let body = r#"{"sku": 3}"#;
    let original = owned(
        store
            .claim(&spec("alice", "k1", body, Class::Write, "a"))
            .await
            .unwrap(),
    );
    let now = store.now().await.unwrap();
    store
        .churn_put(&churn::undelivered(&original, CHURN, now))
        .await
        .unwrap();
    store
        .release(
            &original.fence().unwrap(),
            Some("upstream timed out".into()),
            WINDOW,
        )
        .await
        .unwrap();
    let (again, first) = churn::claim(
        &*store,
        &spec("alice", "k2", body, Class::Write, "b"),
        CHURN,
        &|| false,
    )
    .await
    .unwrap();
    assert!(first, "joined now");
    let Claim::Owned(r) = again else {
        panic!("claimed again: {again:?}");
    };
    assert_eq!(r.id, original.id);
    assert_eq!(r.key, "k1", "under the original's key");
    assert_eq!(r.attempt, original.attempt + 1);
    assert_eq!(r.owner.as_deref(), Some("b"));
    // Its key names the record from then on.
    let (named, first) = churn::claim(
        &*store,
        &spec("alice", "k2", body, Class::Write, "c"),
        CHURN,
        &|| false,
    )
    .await
    .unwrap();
    assert!(!first);
    assert!(
        matches!(&named, Claim::Existing(r) if r.id == original.id),
        "{named:?}"
    );
}
