//! The limits a PostgreSQL store's connections get, against a real server: the pool's
//! size, the statement timeout (oncely's default, or the URL's
//! `options=-c statement_timeout=...`), and the application name (`oncely`, or the
//! URL's `application_name`).

use std::time::{Duration, Instant};

use oncely_core::Class;
use oncely_store::postgres::PgStore;
use oncely_store::{Ledger, StoreOptions};
use oncely_store_conformance::spec;
use oncely_store_conformance::testing::{fresh_pg_schema, shared_pg_url};

/// `SHOW name` on a pooled connection of `store`.
async fn setting(store: &PgStore, name: &str) -> String {
    let client = store.pool().get().await.unwrap();
    client
        .query_one(&format!("SHOW {name}"), &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn pooled_connections_get_the_pool_size_a_statement_timeout_and_the_name_oncely() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let options = StoreOptions {
        pool_size: 5,
        ..StoreOptions::default()
    };
    let store = PgStore::connect(&url, options).await.unwrap();
    assert_eq!(store.pool().status().max_size, 5);
    assert_eq!(setting(&store, "statement_timeout").await, "10s");
    assert_eq!(setting(&store, "application_name").await, "oncely");
}

#[tokio::test]
async fn the_url_sets_the_statement_timeout_and_a_slower_statement_is_cancelled() {
    let base = fresh_pg_schema(&shared_pg_url()).await;
    // Beside the schema the URL already sets in `options`.
    let url = base.replace("options=", "options=-c%20statement_timeout%3D300ms%20")
        + "&application_name=billing-gateway";
    let store = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap();
    assert_eq!(setting(&store, "statement_timeout").await, "300ms");
    assert_eq!(setting(&store, "application_name").await, "billing-gateway");
    let client = store.pool().get().await.unwrap();
    let started = Instant::now();
    let err = client.query("SELECT pg_sleep(5)", &[]).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(client);
    // The other settings of `options` still apply: the store works in its own schema.
    let claim = store
        .claim(&spec("alice", "k", "{}", Class::Write, "a"))
        .await
        .unwrap();
    assert!(matches!(claim, oncely_store::Claim::Owned(_)), "{claim:?}");
    // `0` turns it off.
    let url = base.replace("options=", "options=-cstatement_timeout%3D0%20");
    let store = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap();
    assert_eq!(setting(&store, "statement_timeout").await, "0");
}

/// Migrations are not bound by the statement timeout: an instance that starts while
/// another holds the migration lock (a long migration) waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_waits_for_the_lock_longer_than_the_statement_timeout() {
    let base = fresh_pg_schema(&shared_pg_url()).await;
    let url = base.replace("options=", "options=-c%20statement_timeout%3D200ms%20");
    let (mut locker, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let tx = locker.transaction().await.unwrap();
    // migrations::migrate's lock ("oncely" in ASCII).
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&0x6f6e_6365_6c79_i64])
        .await
        .unwrap();
    let opening =
        tokio::spawn(async move { PgStore::connect(&url, StoreOptions::default()).await });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!opening.is_finished(), "it waits for the lock");
    tx.commit().await.unwrap();
    let store = opening.await.unwrap().unwrap();
    assert_eq!(setting(&store, "statement_timeout").await, "200ms");
}

/// A ledger made by an earlier schema is upgraded when a newer oncely opens it, and keeps
/// its records: from version 6 (no usage history; repeats kept as events, and counted on
/// records without events by older releases), from version 5 (timelines keyed by the
/// timeline alone, no `oncely_primary()`), and from version 4 (no `timelines`).
#[tokio::test]
async fn a_ledger_of_the_previous_schema_is_upgraded_and_keeps_its_records() {
    use oncely_store::{Admin, Ledger, Repeat, RepeatKind};
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let store = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap();
    let first = spec("alice", "k1", "{}", Class::Write, "a");
    store.claim(&first).await.unwrap();
    let done = match store
        .claim(&spec("alice", "k2", "{}", Class::Write, "a"))
        .await
        .unwrap()
    {
        oncely_store::Claim::Owned(r) => r,
        other => panic!("{other:?}"),
    };
    store
        .complete(
            &done.fence().unwrap(),
            oncely_store_conformance::completion("{}", 4),
        )
        .await
        .unwrap();
    let now = store.now().await.unwrap();
    let one = |kind| Repeat {
        at: now,
        kind,
        count: 1,
        units: 4,
    };
    store
        .record_repeats(
            &done.id,
            "alice",
            &done.route,
            &[one(RepeatKind::Joined), one(RepeatKind::Replayed)],
        )
        .await
        .unwrap();
    drop(store);
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let count = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    // Back to version 6, as the previous release left it, with 3 more repeats counted on
    // the record alone (as releases before repeat events, or past the tally's limit, did).
    const BEFORE_USAGE_HISTORY: &str = "DROP TABLE usage_hours; \
         ALTER TABLE repeat_events DROP COLUMN count; \
         DELETE FROM schema_migrations WHERE version = 7";
    client
        .batch_execute(&format!(
            "{BEFORE_USAGE_HISTORY}; UPDATE records SET repeats = repeats + 3, \
             repeat_units = repeat_units + 12 WHERE key = 'k2'"
        ))
        .await
        .unwrap();
    let store = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap();
    let usage = store.usage(None).await.unwrap();
    assert_eq!(
        (
            usage.totals.fresh,
            usage.totals.fresh_units,
            usage.totals.repeats,
            usage.totals.repeat_units
        ),
        (1, 4, 5, 20),
        "what the records held is kept"
    );
    let events = store.repeat_events("alice", None, 100).await.unwrap();
    assert_eq!((events.total, events.total_units), (5, 20));
    // The three the record alone held are one event, at its completion.
    let mut counts: Vec<u64> = events.listed.iter().map(|e| e.count).collect();
    counts.sort();
    assert_eq!(counts, [1, 1, 3]);
    drop(store);

    // Back to version 5, as the release before `oncely_primary()` left it: its timeline
    // row (keyed by the timeline alone) stays, and the primary is recorded beside it.
    client
        .batch_execute(&format!(
            "{BEFORE_USAGE_HISTORY}; DROP FUNCTION oncely_primary(); \
             DELETE FROM timelines WHERE timeline LIKE '%@%'; \
             DELETE FROM schema_migrations WHERE version = 6"
        ))
        .await
        .unwrap();
    assert_eq!(count("SELECT count(*) FROM timelines").await, 1);
    let store = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap();
    assert!(store
        .lookup(&first.scope, &first.key)
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        count("SELECT max(version)::bigint FROM schema_migrations").await,
        10
    );
    assert_eq!(count("SELECT count(*) FROM timelines").await, 2);
    drop(store);

    // Back to version 4, as the previous oncely left it.
    client
        .batch_execute(&format!(
            "{BEFORE_USAGE_HISTORY}; DROP TABLE timelines; DROP FUNCTION oncely_primary(); \
             DELETE FROM schema_migrations WHERE version >= 5"
        ))
        .await
        .unwrap();

    let store = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap();
    let kept = store.lookup(&first.scope, &first.key).await.unwrap();
    assert!(kept.is_some(), "the record made before the upgrade is kept");
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
    assert_eq!(versions, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let timelines: i64 = client
        .query_one("SELECT count(*) FROM timelines", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        timelines, 2,
        "the current timeline (migration 5) and primary (migration 6) are recorded"
    );
}

/// A role that may not read the server's WAL position (Aurora PostgreSQL is reported to
/// refuse `pg_current_wal_lsn()` unless logical replication is on; a DBA may revoke it):
/// the ledger is created, and leases lapse and are taken over, by the server's address
/// and start time alone.
#[tokio::test]
async fn a_role_that_may_not_read_the_wal_position_still_migrates_and_takes_over() {
    use oncely_store::{ManualClock, TakeOverOutcome, TaskQueue};
    use oncely_store_conformance::testing::fresh_pg_database;

    let base = shared_pg_url();
    let db = fresh_pg_database(&base).await;
    let (admin, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {db} LOGIN; ALTER DATABASE {db} OWNER TO {db}"
        ))
        .await
        .unwrap();
    let (path, query) = base.split_once('?').unwrap_or((&base, ""));
    let at = |user: &str| {
        let (server, _) = path.rsplit_once('/').unwrap();
        let server = server.replacen("postgres@", &format!("{user}@"), 1);
        let sep = if query.is_empty() { "" } else { "?" };
        format!("{server}/{db}{sep}{query}")
    };
    let (owner, connection) = tokio_postgres::connect(&at("postgres"), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    owner
        .batch_execute(&format!(
            "REVOKE EXECUTE ON FUNCTION pg_current_wal_lsn() FROM PUBLIC; \
             GRANT ALL ON SCHEMA public TO {db}"
        ))
        .await
        .unwrap();
    let url = at(&db);
    let (limited, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let refused = limited.simple_query("SELECT pg_current_wal_lsn()").await;
    assert!(refused.is_err(), "the role can still read the WAL position");

    let clock = ManualClock::new();
    let options = StoreOptions {
        clock: std::sync::Arc::new(clock.clone()),
        ..StoreOptions::default()
    };
    let store = PgStore::connect(&url, options).await.unwrap();
    let lease = Duration::from_secs(2);
    let mut first = spec("alice", "k1", "{}", Class::Write, "a");
    first.lease = lease;
    let oncely_store::Claim::Owned(r) = store.claim(&first).await.unwrap() else {
        panic!("a new key is owned");
    };
    clock.advance(lease + Duration::from_secs(1));
    let taken = store.take_over(&r.id, 1, "b", lease).await.unwrap();
    assert!(
        matches!(&taken, TakeOverOutcome::Owned(t) if t.attempt == 2),
        "{taken:?}"
    );
    assert!(store
        .lease_tasks("webhook", "w", 10, lease)
        .await
        .unwrap()
        .is_empty());
}
