//! The conformance suite and the PostgreSQL-only behaviours against a real server.
//!
//! The server is `ONCELY_TEST_PG_URL` (set by `scripts/test`, which starts a throwaway
//! one). Without it, on CI (`CI` set) every test fails; elsewhere the test process starts
//! its own server with `scripts/pg-env serve` and stops it when it exits. Every store gets
//! a fresh schema (`search_path` in the URL), so tests run in parallel on one database.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use oncely_core::{Class, State, TransitionError};
use oncely_store::postgres::{migrations::MIGRATIONS, PgStore};
use oncely_store::{Admin, Claim, Ledger, ManualClock, Store, StoreError, StoreOptions, Waiting};
use oncely_store_conformance::testing::{fresh_pg_schema, shared_pg_url, PgServer};
use oncely_store_conformance::{completion, spec, Harness, LEASE};
use tokio_postgres::{AsyncMessage, NoTls};

fn options(clock: &ManualClock) -> StoreOptions {
    StoreOptions {
        clock: Arc::new(clock.clone()),
        ..StoreOptions::default()
    }
}

#[derive(Default)]
struct PgHarness {
    clock: ManualClock,
    url: Mutex<Option<String>>,
}

#[async_trait]
impl Harness for PgHarness {
    type Store = dyn Store;

    async fn store(&self) -> Arc<dyn Store> {
        let url = fresh_pg_schema(&shared_pg_url()).await;
        *self.url.lock().unwrap() = Some(url.clone());
        Arc::new(PgStore::connect(&url, options(&self.clock)).await.unwrap())
    }

    async fn second(&self) -> Arc<dyn Store> {
        let url = self.url.lock().unwrap().clone().expect("store() first");
        Arc::new(PgStore::connect(&url, options(&self.clock)).await.unwrap())
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

oncely_store_conformance::conformance_tests!(PgHarness::default());

fn owned(c: Claim) -> oncely_core::Record {
    match c {
        Claim::Owned(r) => r,
        Claim::Existing(r) => panic!("expected to own the claim, found {r:?}"),
    }
}

/// `oncely_store::open` routes `postgres://` here and migrates.
#[tokio::test]
async fn open_by_url_migrates_and_works() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let store = oncely_store::open(&url, StoreOptions::default())
        .await
        .unwrap();
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    assert_eq!(store.get(&r.id).await.unwrap().unwrap(), r);
}

/// Every migration is applied once, even when several instances start together.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_run_once_under_concurrent_starts() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let starts: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PgStore::connect(&url, StoreOptions::default()).await })
        })
        .collect();
    for s in starts {
        s.await.unwrap().unwrap();
    }
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let versions: Vec<i32> = client
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let expected: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(versions, expected);
    // A schema newer than this build is refused with a clear error, not half-used.
    client
        .execute(
            "INSERT INTO schema_migrations (version, name) VALUES (9999, 'from the future')",
            &[],
        )
        .await
        .unwrap();
    let err = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Config(m) if m.contains("9999")),
        "{err:?}"
    );
}

/// Times come from the database's clock plus the injected offset.
#[tokio::test]
async fn times_come_from_the_database_clock() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let clock = ManualClock::new();
    let store = PgStore::connect(&url, options(&clock)).await.unwrap();
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let db_ms: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let now = store.now().await.unwrap();
    assert!((now.0 - db_ms).abs() < 1_000, "{} vs {db_ms}", now.0);
    clock.advance(Duration::from_secs(3600));
    let later = store.now().await.unwrap();
    let moved = later.0 - now.0;
    assert!((3_600_000..3_601_000).contains(&moved), "moved {moved} ms");
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    assert!(r.created_at.0 >= later.0);
    assert_eq!(
        r.lease_until.unwrap().0 - r.created_at.0,
        LEASE.as_millis() as i64
    );
}

/// NOTIFY is sent only for records somebody waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notify_only_for_waited_records() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let store = Arc::new(
        PgStore::connect(&url, StoreOptions::default())
            .await
            .unwrap(),
    );
    // An independent LISTEN connection sees what the store sends.
    let (client, mut connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        use futures::StreamExt;
        while let Some(Ok(m)) = stream.next().await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_string());
            }
        }
    });
    client.batch_execute("LISTEN oncely_records").await.unwrap();

    let quiet = owned(
        store
            .claim(&spec("alice", "quiet", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    store
        .complete(&quiet.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap();
    let waited = owned(
        store
            .claim(&spec("alice", "waited", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    let waiter = {
        let store = store.clone();
        let id = waited.id.clone();
        tokio::spawn(async move { store.wait_for(&id, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    store
        .complete(&waited.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap();
    assert_eq!(waiter.await.unwrap().unwrap().state, State::Completed);
    // Other tests share the channel: look only at this test's two ids.
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut seen = Vec::new();
    while let Ok(Some(id)) = tokio::time::timeout_at(deadline.into(), rx.recv()).await {
        if id == quiet.id.0 || id == waited.id.0 {
            seen.push(id);
        }
    }
    assert_eq!(
        seen,
        vec![waited.id.0.clone()],
        "only the waited record is notified"
    );
    // The waiter uncounted itself: a later transition of the record sends nothing.
    let (client2, connection2) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection2);
    let mut waiting = -1;
    for _ in 0..50 {
        waiting = client2
            .query_one("SELECT waiting FROM records WHERE id = $1", &[&waited.id.0])
            .await
            .unwrap()
            .get(0);
        if waiting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(waiting, 0);
}

/// A store pointed at a closed port answers Unavailable within a few seconds.
#[tokio::test]
async fn unreachable_server_is_unavailable_quickly() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let err = PgStore::connect(
        &format!("postgres://postgres@127.0.0.1:{port}/oncely"),
        StoreOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let bad = PgStore::connect("postgres://[::1", StoreOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(bad, StoreError::Config(_)), "{bad:?}");
}

/// When the server goes away, operations answer Unavailable; when it comes back, the
/// same store works again and cross-instance wake-ups resume (the listener reconnects).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recovers_when_the_server_returns() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let url = server.url.clone();
    let a = Arc::new(
        PgStore::connect(&url, StoreOptions::default())
            .await
            .unwrap(),
    );
    let b = Arc::new(
        PgStore::connect(&url, StoreOptions::default())
            .await
            .unwrap(),
    );
    owned(
        a.claim(&spec("alice", "before", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );

    let server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    let started = Instant::now();
    let err = a
        .claim(&spec("alice", "during", "{}", Class::Write, "a"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(a.ping().await.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "answered in {:?}",
        started.elapsed()
    );

    let server = tokio::task::spawn_blocking(move || {
        server.start_again();
        server
    })
    .await
    .unwrap();
    // The pool replaces its dead connections; no restart of the store.
    let deadline = Instant::now() + Duration::from_secs(15);
    let r = loop {
        match a
            .claim(&spec("alice", "after", "{}", Class::Write, "a"))
            .await
        {
            Ok(c) => break owned(c),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the store did not recover: {e:?}"),
        }
    };
    // Give b's listener time to reconnect (its backoff is at most 5 s), then check that a
    // completion on a wakes a waiter on b promptly.
    let deadline = Instant::now() + Duration::from_secs(15);
    while b.ping().await.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
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
    assert!(lag < Duration::from_millis(500), "woke {lag:?} after");
    drop((a, b));
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}

/// Concurrent claims are grouped into one statement: each claim still gets exactly what
/// it would alone (distinct keys owned, duplicates see the owner's record, a released
/// key reclaimed once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grouped_claims_answer_each_claim_alone() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let store = Arc::new(
        PgStore::connect(
            &url,
            StoreOptions {
                pool_size: 2,
                ..StoreOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let released = owned(
        store
            .claim(&spec("alice", "released", "{}", Class::Write, "first"))
            .await
            .unwrap(),
    );
    store
        .release(&released.fence().unwrap(), None, Duration::from_secs(3600))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..300 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let key = match i % 3 {
                0 => "released".to_string(),
                _ => format!("k{}", i / 6),
            };
            let claim = store
                .claim(&spec("alice", &key, "{}", Class::Write, &format!("o{i}")))
                .await
                .unwrap();
            (key, claim)
        }));
    }
    let mut by_key: std::collections::HashMap<String, (usize, Vec<String>)> = Default::default();
    let mut fences = Vec::new();
    for t in tasks {
        let (key, claim) = t.await.unwrap();
        let entry = by_key.entry(key).or_default();
        if let Claim::Owned(r) = &claim {
            fences.push(r.fence().unwrap());
            entry.0 += 1;
            if r.key == "released" {
                assert_eq!(r.id, released.id);
                assert_eq!(r.attempt, 2);
            }
        }
        entry.1.push(claim.record().id.0.clone());
    }
    assert_eq!(by_key.len(), 51);
    for (key, (owners, ids)) in by_key {
        assert_eq!(owners, 1, "key {key} has one owner");
        assert!(ids.iter().all(|id| *id == ids[0]), "key {key}: {ids:?}");
    }
    // Completions are grouped too: each record completes once, with its own body; the
    // duplicate completion is answered with the record as written, and a wrong attempt
    // is refused, as they would be alone.
    let mut tasks = Vec::new();
    for (n, fence) in fences.iter().enumerate() {
        for copy in 0..2 {
            let (store, fence) = (store.clone(), fence.clone());
            tasks.push(tokio::spawn(async move {
                let body = format!("{{\"n\":{n}}}");
                let result = store.complete(&fence, completion(&body, 1)).await;
                (fence, body, copy, result)
            }));
        }
        let mut wrong = fence.clone();
        wrong.attempt += 5;
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let result = store.complete(&wrong, completion("{}", 1)).await;
            (wrong, String::new(), 9, result)
        }));
    }
    let mut completed = std::collections::HashMap::new();
    for t in tasks {
        let (fence, body, copy, result) = t.await.unwrap();
        match result {
            Ok(r) => {
                assert_ne!(copy, 9, "a wrong attempt completed {r:?}");
                assert_eq!(r.response.unwrap().body.unwrap(), body.as_bytes());
                let at = r.completed_at.unwrap();
                let first = *completed.entry(fence.id.clone()).or_insert(at);
                assert_eq!(first, at, "completed twice");
            }
            Err(StoreError::Transition(TransitionError::Fenced { .. })) if copy == 9 => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(completed.len(), fences.len());
}

/// A claim that meets a completed record is answered from memory once a claim has read
/// it: the row can change behind the store's back (which no transition does) and the
/// replay still carries the completion as it was committed.
#[tokio::test]
async fn replays_of_completed_records_are_answered_from_memory() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let clock = ManualClock::new();
    let store = PgStore::connect(&url, options(&clock)).await.unwrap();
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    store
        .complete(&r.fence().unwrap(), completion("{\"n\":1}", 3))
        .await
        .unwrap();
    // The first replay reads the row, and keeps it.
    let Claim::Existing(first) = store
        .claim(&spec("alice", "k", "{}", Class::Write, "b"))
        .await
        .unwrap()
    else {
        panic!("a completed record is not claimed again");
    };
    assert_eq!(&first.response.unwrap().body.unwrap()[..], b"{\"n\":1}");
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .execute("UPDATE records SET response_body = 'changed'", &[])
        .await
        .unwrap();
    // Another instance reads the row; this one answers from what it completed.
    let other = PgStore::connect(&url, options(&clock)).await.unwrap();
    for (store, body) in [(&store, "{\"n\":1}"), (&other, "changed")] {
        let Claim::Existing(again) = store
            .claim(&spec("alice", "k", "{}", Class::Write, "b"))
            .await
            .unwrap()
        else {
            panic!("a completed record is not claimed again");
        };
        assert_eq!(again.id, r.id);
        let got = again.response.unwrap().body.unwrap();
        assert_eq!(&got[..], body.as_bytes());
    }
    // `get` and `lookup` still read the row (its counters move).
    let read = store.get(&r.id).await.unwrap().unwrap();
    assert_eq!(&read.response.unwrap().body.unwrap()[..], b"changed");
}

/// A cached completion is served only until shortly before the record expires: once
/// another instance may purge it, the next claim executes afresh.
#[tokio::test]
async fn a_cached_replay_ends_before_its_window_does() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let clock = ManualClock::new();
    let store = PgStore::connect(&url, options(&clock)).await.unwrap();
    let other = PgStore::connect(&url, options(&clock)).await.unwrap();
    let claim = || spec("alice", "k", "{}", Class::Write, "a");
    let r = owned(store.claim(&claim()).await.unwrap());
    let mut done = completion("{}", 1);
    done.window = Duration::from_secs(10);
    store.complete(&r.fence().unwrap(), done).await.unwrap();
    assert!(matches!(store.claim(&claim()).await.unwrap(), Claim::Existing(e) if e.id == r.id));
    // Just under a second before the end of the window the cache no longer answers; the
    // database (which still holds the record) does.
    clock.advance(Duration::from_millis(9_100));
    assert!(matches!(store.claim(&claim()).await.unwrap(), Claim::Existing(e) if e.id == r.id));
    clock.advance(Duration::from_millis(1_000));
    assert_eq!(other.purge_expired().await.unwrap(), 1);
    let again = owned(store.claim(&claim()).await.unwrap());
    assert_ne!(again.id, r.id);
}

/// A claim grouped with others while a purge deletes the expired record that held its key
/// (the purge commits while the insert waits for it): the statement's snapshot still shows
/// the deleted row, and the claimant was handed that one instead of the record it had just
/// inserted. It then found its own record held and waited on it as a duplicate, and the
/// record was nobody's until its lease lapsed. Every claimant of a new key owns it.
// One thread: the four claims are queued before the dispatcher runs, so they are one
// grouped statement, which starts while the delete holds the key's row.
#[tokio::test(flavor = "current_thread")]
async fn a_claim_that_meets_a_purge_owns_the_record_it_inserted() {
    let clock = ManualClock::new();
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let store = Arc::new(PgStore::connect(&url, options(&clock)).await.unwrap());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    for round in 0..20 {
        let old = owned(
            store
                .claim(&spec(
                    "alice",
                    &format!("k{round}"),
                    "{}",
                    Class::Write,
                    "a",
                ))
                .await
                .unwrap(),
        );
        store
            .complete(&old.fence().unwrap(), completion("{}", 1))
            .await
            .unwrap();
        clock.advance(oncely_store_conformance::WINDOW + Duration::from_secs(1));
        // A purge's delete of the expired record, committed while the claims wait for it.
        client.batch_execute("BEGIN").await.unwrap();
        client
            .execute("DELETE FROM records WHERE id = $1", &[&old.id.0])
            .await
            .unwrap();
        let claims = (0..4).map(|n| {
            let store = store.clone();
            let key = if n == 0 {
                format!("k{round}")
            } else {
                format!("other-{round}-{n}")
            };
            async move {
                store
                    .claim(&spec("alice", &key, "{}", Class::Write, &format!("b{n}")))
                    .await
                    .unwrap()
            }
        });
        let commit = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            client.batch_execute("COMMIT").await.unwrap();
        };
        let (claims, ()) = tokio::join!(futures::future::join_all(claims), commit);
        for (n, claim) in claims.into_iter().enumerate() {
            assert!(
                matches!(&claim, Claim::Owned(r) if r.owner.as_deref() == Some(&*format!("b{n}"))),
                "round {round}, claim {n}: a new key's claimant does not own it: {claim:?}"
            );
        }
    }
}

/// A record whose answer is too large for the replay cache is served from memory only
/// while a replay holds its body (one copy for every replay in flight, no round trip);
/// once nobody holds it, a claim reads the row again. Shown by changing the row from
/// outside: the held copy answers, then the row's new body does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_is_served_from_memory_only_while_a_replay_holds_it() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let clock = ManualClock::new();
    let store = PgStore::connect(&url, options(&clock)).await.unwrap();
    let big = "y".repeat(1 << 20);
    let r = owned(
        store
            .claim(&spec("alice", "big", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    store
        .complete(&r.fence().unwrap(), completion(&big, 1))
        .await
        .unwrap();
    let replay = || async {
        match store
            .claim(&spec("alice", "big", "{}", Class::Write, "b"))
            .await
            .unwrap()
        {
            Claim::Existing(r) => r.response.unwrap().body.unwrap(),
            Claim::Owned(_) => panic!("a completed record is not claimed again"),
        }
    };
    let held = replay().await;
    assert_eq!(held, big.as_bytes());
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    // Another length: a read of the row could not pass for the held copy.
    let changed = "z".repeat((1 << 20) + 1);
    client
        .execute(
            "UPDATE records SET response_body = $1",
            &[&changed.as_bytes()],
        )
        .await
        .unwrap();
    let from_memory = replay().await;
    assert_eq!(
        from_memory.as_ptr(),
        held.as_ptr(),
        "the held copy, no read"
    );
    drop((held, from_memory));
    assert_eq!(
        replay().await,
        changed.as_bytes(),
        "nobody holds it: read again"
    );
}
