//! The write path's schema (migration 8, issue 28) against a real server: the claim hash
//! the migration computes in SQL is the one the store computes, a colliding hash is
//! refused, a version-7 ledger is upgraded in place and keeps every record, the lists the
//! gateway polls read an index, and the purge goes in batches.

use std::sync::Arc;
use std::time::Duration;

use oncely_core::{Class, Record, Scope, State};
use oncely_store::postgres::{migrations::MIGRATIONS, PgStore};
use oncely_store::{
    new_record_id, Admin, Claim, Ledger, ListFilter, ManualClock, StoreError, StoreOptions,
};
use oncely_store_conformance::spec;
use oncely_store_conformance::testing::{fresh_pg_schema, shared_pg_url};
use tokio_postgres::{Client, NoTls};

fn options(clock: &ManualClock) -> StoreOptions {
    StoreOptions {
        clock: Arc::new(clock.clone()),
        ..StoreOptions::default()
    }
}

/// A plain connection to the schema `url` names.
async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// The migration's SQL for the claim hash, as a query of `$1` scope and `$2` key.
const CLAIM_SQL: &str = "SELECT substring(sha256(convert_to('oncely/claim/v1', 'UTF8') \
     || '\\x00'::bytea || convert_to($1::text, 'UTF8') || '\\x00'::bytea \
     || convert_to($2::text, 'UTF8')) FROM 1 FOR 16)";

#[tokio::test]
async fn the_migrations_claim_hash_is_the_stores() {
    let client = connect(&shared_pg_url()).await;
    let scope = "ab".repeat(32);
    let row = client
        .query_one(CLAIM_SQL, &[&scope, &"order-1"])
        .await
        .unwrap();
    let hash: Vec<u8> = row.get(0);
    assert_eq!(hex::encode(&hash), "eb89224ab9eac58caae1ecf12e6ca5f9");
    let scope = Scope::new("alice", "POST /v1/render");
    let row = client
        .query_one(CLAIM_SQL, &[&scope.as_str(), &"ключ-ü"])
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, Vec<u8>>(0),
        scope.claim_hash("ключ-ü").to_vec()
    );
}

#[tokio::test]
async fn a_colliding_claim_hash_is_refused_not_answered_with_another_record() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let store = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap();
    let first = spec("alice", "k1", "{}", Class::Write, "a");
    let Claim::Owned(held) = store.claim(&first).await.unwrap() else {
        panic!("a fresh key is owned");
    };
    // Make k1's row carry k2's hash, as a collision would.
    let other = spec("alice", "k2", "{}", Class::Write, "a");
    let client = connect(&url).await;
    client
        .execute(
            "UPDATE records SET claim = $1 WHERE id = $2",
            &[&other.scope.claim_hash(&other.key).as_slice(), &held.id.0],
        )
        .await
        .unwrap();
    let refused = store.claim(&other).await;
    assert!(
        matches!(&refused, Err(StoreError::Unavailable(m)) if m.contains("collision")),
        "{refused:?}"
    );
    let looked_up = store.lookup(&other.scope, &other.key).await;
    assert!(
        matches!(&looked_up, Err(StoreError::Unavailable(m)) if m.contains("collision")),
        "{looked_up:?}"
    );
    assert!(store
        .lookup(&first.scope, &first.key)
        .await
        .unwrap()
        .is_none());
}

/// The columns of a record as version 7 wrote them, for comparison across the upgrade.
const SNAPSHOT: &str = "SELECT id, scope, key, fingerprint, class, route, principal, state,
        owner, attempt, lease_until, created_at, updated_at, completed_at, expires_at,
        response_status, response_headers, response_body, units, repeats, repeat_units,
        workflow_id, provider_request_id, last_error, waiting
    FROM records ORDER BY id";

/// Every column of every record, as text.
async fn snapshot(client: &Client) -> Vec<String> {
    client
        .query(
            &format!("SELECT row_to_json(s)::text FROM ({SNAPSHOT}) s"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Inserts a record as version 7 did; returns its id.
async fn insert_v7(
    client: &Client,
    key: &str,
    state: &str,
    response: bool,
    at: i64,
    expires_at: Option<i64>,
) -> String {
    let s = spec("alice", key, "{}", Class::Write, "a");
    let id = new_record_id().0;
    let owner = (state == "processing").then_some("a/1");
    let lease = (state == "processing").then_some(at + 3_600_000);
    let (status, headers, body) = if response {
        (
            Some(201),
            Some(r#"[["content-type","application/json"]]"#),
            Some(b"{\"ok\":1}".to_vec()),
        )
    } else {
        (None, None, None)
    };
    client
        .execute(
            "INSERT INTO records (id, scope, key, fingerprint, class, route, principal, state,
                 owner, attempt, lease_until, created_at, updated_at, completed_at, expires_at,
                 response_status, response_headers, response_body, units, repeats,
                 repeat_units, workflow_id, last_error)
             VALUES ($1, $2, $3, $4, 'write', $5, 'alice', $6, $7, 2, $8, $9, $9,
                 CASE WHEN $6 = 'completed' THEN $9::bigint END, $10, $11, $12, $13,
                 CASE WHEN $6 = 'completed' THEN 3 ELSE 0 END,
                 CASE WHEN $6 = 'completed' THEN 2 ELSE 0 END,
                 CASE WHEN $6 = 'completed' THEN 6 ELSE 0 END, 'wf-1',
                 CASE WHEN $6 = 'released' THEN 'boom' END)",
            &[
                &id,
                &s.scope.as_str(),
                &key,
                &s.fingerprint.0.as_slice(),
                &s.route,
                &state,
                &owner,
                &lease,
                &at,
                &expires_at,
                &status,
                &headers,
                &body,
            ],
        )
        .await
        .unwrap();
    id
}

#[tokio::test]
async fn a_version_7_ledger_is_upgraded_in_place_and_keeps_every_record() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let client = connect(&url).await;
    // The schema as oncely left it at version 7.
    client
        .batch_execute(
            "CREATE TABLE schema_migrations (
                 version    integer PRIMARY KEY,
                 name       text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
    for m in &MIGRATIONS[..7] {
        client.batch_execute(m.sql).await.unwrap();
        client
            .execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                &[&m.version, &m.name],
            )
            .await
            .unwrap();
    }
    let now: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let hour = 3_600_000;
    let processing = insert_v7(&client, "k-proc", "processing", false, now - 4000, None).await;
    let done = insert_v7(
        &client,
        "k-done",
        "completed",
        true,
        now - 3000,
        Some(now + hour),
    )
    .await;
    let released = insert_v7(
        &client,
        "k-rel",
        "released",
        false,
        now - 2000,
        Some(now + hour),
    )
    .await;
    let unknown = insert_v7(&client, "k-unk", "outcome_unknown", false, now - 1000, None).await;
    client
        .execute(
            "INSERT INTO repeat_events (record_id, principal, route, at, kind, count, units,
                                        expires_at)
             VALUES ($1, 'alice', 'POST /v1/render', $2, 'replayed', 1, 3, $3),
                    ($1, 'alice', 'POST /v1/render', $2, 'joined', 1, 3, $3)",
            &[&done, &now, &(now + hour)],
        )
        .await
        .unwrap();
    let before = snapshot(&client).await;

    let clock = ManualClock::default();
    let store = PgStore::connect(&url, options(&clock)).await.unwrap();
    let version: i32 = client
        .query_one("SELECT max(version) FROM schema_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, MIGRATIONS.last().unwrap().version);
    assert_eq!(
        snapshot(&client).await,
        before,
        "every column of every record is kept"
    );
    let get = |id: &str| {
        let store = &store;
        let id = oncely_core::RecordId(id.to_string());
        async move { store.get(&id).await.unwrap().expect("kept") }
    };
    let d: Record = get(&done).await;
    assert_eq!(d.state, State::Completed);
    let response = d.response.clone().expect("the response is kept");
    assert_eq!(response.status, 201);
    assert_eq!(response.body.as_deref(), Some(&b"{\"ok\":1}"[..]));
    assert_eq!((d.units, d.repeats, d.repeat_units), (3, 2, 6));
    assert_eq!(get(&processing).await.state, State::Processing);
    assert_eq!(get(&released).await.state, State::Released);
    assert_eq!(get(&unknown).await.state, State::OutcomeUnknown);
    let found = store
        .lookup(&Scope::new("alice", "POST /v1/render"), "k-rel")
        .await
        .unwrap()
        .expect("found by its claim hash");
    assert_eq!(found.id.0, released);

    // A repeat of the completed key replays it; a new key is owned.
    match store
        .claim(&spec("alice", "k-done", "{}", Class::Write, "b"))
        .await
        .unwrap()
    {
        Claim::Existing(r) => {
            assert_eq!(r.id.0, done);
            assert_eq!(r.response, Some(response));
        }
        other => panic!("expected the completed record, got {other:?}"),
    }
    let Claim::Owned(fresh) = store
        .claim(&spec("alice", "k-new", "{}", Class::Write, "b"))
        .await
        .unwrap()
    else {
        panic!("a new key is owned");
    };

    // Newest first, and the polled states through their index.
    let listed: Vec<String> = store
        .list(&ListFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id.0)
        .collect();
    assert_eq!(
        listed,
        [
            fresh.id.0.clone(),
            unknown.clone(),
            released,
            done,
            processing.clone()
        ]
    );
    let unknowns = store
        .list(&ListFilter {
            state: Some(State::OutcomeUnknown),
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(unknowns.len(), 1);
    assert_eq!(unknowns[0].id.0, unknown);
    let open = store
        .list(&ListFilter {
            state: Some(State::Processing),
            ..ListFilter::default()
        })
        .await
        .unwrap();
    let open: Vec<&str> = open.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(open, [fresh.id.as_str(), processing.as_str()]);

    // Purge and usage count what version 7 wrote.
    let usage = store.usage(None).await.unwrap();
    assert_eq!(
        (
            usage.totals.fresh,
            usage.totals.fresh_units,
            usage.totals.repeats
        ),
        (1, 3, 2)
    );
    clock.advance(Duration::from_millis(2 * hour as u64));
    assert_eq!(
        store.purge_expired().await.unwrap(),
        2,
        "completed and released"
    );
    let after = store.usage(None).await.unwrap();
    assert_eq!(
        after.totals, usage.totals,
        "the purge folds what it deletes"
    );
    assert!(get(&unknown).await.state == State::OutcomeUnknown);
}

/// How many sequential scans of `records` and index scans of each of its indexes the
/// server counted (a store's connections are closed first: they report on exit).
async fn scans(client: &Client) -> (i64, i64, i64) {
    tokio::time::sleep(Duration::from_millis(700)).await;
    let row = client
        .query_one(
            "SELECT t.seq_scan,
                    (SELECT idx_scan FROM pg_stat_user_indexes i
                     WHERE i.relid = t.relid AND i.indexrelname = 'records_open'),
                    (SELECT idx_scan FROM pg_stat_user_indexes i
                     WHERE i.relid = t.relid AND i.indexrelname = 'records_pkey')
             FROM pg_stat_user_tables t
             WHERE t.relname = 'records' AND t.schemaname = current_schema()",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// A new schema whose connections use generic plans only (the plan a prepared statement
/// may settle on after its first executions must use the indexes too), holding 20,000
/// records `g` = 1..20000 with the state and expiry the SQL expressions `state` and
/// `expires` give for `g`; its URL and a client.
async fn generic_plan_ledger(state: &str, expires: &str) -> (String, Client) {
    let url = format!(
        "{}%20-cplan_cache_mode%3Dforce_generic_plan",
        fresh_pg_schema(&shared_pg_url()).await
    );
    drop(
        PgStore::connect(&url, StoreOptions::default())
            .await
            .unwrap(),
    );
    let client = connect(&url).await;
    client
        .batch_execute(&format!(
            "INSERT INTO records (id, claim, scope, key, fingerprint, class, route, principal,
                 state, owner, attempt, created_at, updated_at, completed_at, expires_at)
             SELECT 'rec_' || lpad(to_hex(g), 32, '0'),
                    substring(sha256(int8send(g)) FROM 1 FOR 16), 'scope', 'k' || g,
                    sha256(int8send(g)), 'write', 'POST /v1/render', 'alice',
                    {state}, 'o', 1, g, g, g, {expires}
             FROM generate_series(1, 20000) g;
             ANALYZE records"
        ))
        .await
        .unwrap();
    (url, client)
}

#[tokio::test]
async fn the_polled_lists_read_an_index_not_the_table() {
    // One in a thousand outcome_unknown, one processing.
    let (url, client) = generic_plan_ledger(
        "CASE g % 1000 WHEN 0 THEN 'outcome_unknown' WHEN 1 THEN 'processing'
              ELSE 'completed' END",
        "9000000000000000",
    )
    .await;
    let before = scans(&client).await;
    let store = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap();
    for _ in 0..8 {
        let unknown = store
            .list(&ListFilter {
                state: Some(State::OutcomeUnknown),
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(unknown.len(), 20);
        assert!(
            unknown.windows(2).all(|w| w[0].id > w[1].id),
            "newest first"
        );
        let newest = store
            .list(&ListFilter {
                limit: Some(50),
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(newest.len(), 50);
        assert_eq!(newest[0].id.0, format!("rec_{:032x}", 20000));
    }
    drop(store);
    let after = scans(&client).await;
    assert_eq!(after.0 - before.0, 0, "no sequential scan of records");
    assert!(
        after.1 - before.1 >= 8,
        "the open states through records_open"
    );
    assert!(
        after.2 - before.2 >= 8,
        "newest first through the primary key"
    );
}

/// A purge reads the expired records through indexes, not by scanning a big ledger
/// (an `OR` of the kinds of expired record in one batch query did: seconds a batch at
/// 10 M records, past the statement timeout).
#[tokio::test]
async fn the_purge_reads_an_index_not_the_table() {
    // 30 completed records expired, 10 released ones expired, the rest live.
    let (url, client) = generic_plan_ledger(
        "CASE WHEN g % 2000 = 7 THEN 'released' ELSE 'completed' END",
        "CASE WHEN g % 2000 = 7 OR g % 667 = 3 THEN 1 ELSE 9000000000000000 END",
    )
    .await;
    let expired: i64 = client
        .query_one("SELECT count(*) FROM records WHERE expires_at = 1", &[])
        .await
        .unwrap()
        .get(0);
    let before = scans(&client).await;
    let store = PgStore::connect(&url, StoreOptions::default())
        .await
        .unwrap();
    assert_eq!(store.purge_expired().await.unwrap(), expired as u64);
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    drop(store);
    let after = scans(&client).await;
    assert_eq!(after.0 - before.0, 0, "no sequential scan of records");
    let left: i64 = client
        .query_one("SELECT count(*) FROM records", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 20_000 - expired);
}

#[tokio::test]
async fn the_purge_goes_in_batches_and_folds_every_record_once() {
    let url = fresh_pg_schema(&shared_pg_url()).await;
    let clock = ManualClock::default();
    let store = PgStore::connect(&url, options(&clock)).await.unwrap();
    let client = connect(&url).await;
    // 2,500 completed records (two and a half batches) and as many repeat events.
    client
        .batch_execute(
            "INSERT INTO records (id, claim, scope, key, fingerprint, class, route, principal,
                 state, attempt, created_at, updated_at, completed_at, expires_at, units)
             SELECT 'rec_' || lpad(to_hex(g), 32, '0'),
                    substring(sha256(int8send(g)) FROM 1 FOR 16), 'scope', 'k' || g,
                    sha256(int8send(g)), 'write', 'POST /v1/render', 'alice', 'completed',
                    1, 1000, 1000, 1000, 2000, 2
             FROM generate_series(1, 2500) g;
             INSERT INTO repeat_events (record_id, principal, route, at, kind, count, units,
                                        expires_at)
             SELECT 'rec_' || lpad(to_hex(g), 32, '0'), 'alice', 'POST /v1/render', 1000,
                    'replayed', 1, 2, 2000
             FROM generate_series(1, 2500) g",
        )
        .await
        .unwrap();
    let usage = store.usage(None).await.unwrap();
    assert_eq!(
        (
            usage.totals.fresh,
            usage.totals.fresh_units,
            usage.totals.repeats
        ),
        (2500, 5000, 2500)
    );
    let second = PgStore::connect(&url, options(&clock)).await.unwrap();
    let (a, b) = tokio::join!(store.purge_expired(), second.purge_expired());
    assert_eq!(a.unwrap() + b.unwrap(), 2500);
    let left: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM records) + (SELECT count(*) FROM repeat_events)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    assert_eq!(store.usage(None).await.unwrap().totals, usage.totals);
}
