//! The write path's schema (migration 8, issue 28) against a real server: the claim hash
//! the migration computes in SQL is the one the store computes, a colliding hash is
//! refused, a version-7 ledger is upgraded in place and keeps every record, the lists the
//! gateway polls read an index, and the purge goes in batches.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncely_core::{Class, Record, Scope, State};
use oncely_store::postgres::{migrations::MIGRATIONS, PgStore};
use oncely_store::{
    new_record_id, Admin, Claim, Ledger, ListFilter, ManualClock, StoreError, StoreOptions,
};
use oncely_store_conformance::spec;
use oncely_store_conformance::testing::{fresh_pg_schema, shared_pg_url};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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

/// A proxy between a store and the server that records the SQL of every statement the
/// store prepares (each Parse message its connections send), so that a test can show the
/// plans of exactly the statements the store ran.
struct Recorder {
    /// The URL a store connects through the proxy with (without TLS, so that the proxy
    /// can read the messages).
    url: String,
    statements: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    /// Starts a proxy to the server `url` names; it lives as long as the test's runtime.
    async fn start(url: &str) -> Recorder {
        let config: tokio_postgres::Config = url.parse().unwrap();
        let host = match &config.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(host) => host.clone(),
            #[allow(unreachable_patterns)]
            other => panic!("the recorder needs a TCP server, not {other:?}"),
        };
        let upstream = (host, config.get_ports().first().copied().unwrap_or(5432));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let statements = Arc::new(Mutex::new(Vec::new()));
        let log = statements.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(upstream.clone()).await.unwrap();
                tokio::spawn(relay(client, server, log.clone()));
            }
        });
        // The server's address is the URL's authority after the user (and password).
        let body = url.find("://").unwrap() + 3;
        let end = url[body..].find('/').map_or(url.len(), |i| body + i);
        let at = url[body..end].rfind('@').map_or(body, |i| body + i + 1);
        let sep = if url.contains('?') { '&' } else { '?' };
        Recorder {
            url: format!(
                "{}127.0.0.1:{port}{}{sep}sslmode=disable",
                &url[..at],
                &url[end..]
            ),
            statements,
        }
    }

    /// How many statements were prepared so far.
    fn mark(&self) -> usize {
        self.statements.lock().unwrap().len()
    }

    /// The statements prepared since `mark`.
    fn since(&self, mark: usize) -> Vec<String> {
        self.statements.lock().unwrap()[mark..].to_vec()
    }
}

/// Relays a connection's bytes both ways, recording the query of each Parse message the
/// client sends.
async fn relay(client: TcpStream, server: TcpStream, log: Arc<Mutex<Vec<String>>>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    // The startup messages have no type byte: a length, then a code (an SSL or GSSAPI
    // request, refused here as sslmode=disable sends none, or the startup message).
    let mut startup = true;
    loop {
        let mut head = vec![0u8; if startup { 4 } else { 5 }];
        if from_client.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes(head[head.len() - 4..].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        if from_client.read_exact(&mut body).await.is_err() {
            return;
        }
        if startup {
            let code = u32::from_be_bytes(body[..4].try_into().unwrap());
            startup = code == 80_877_103 || code == 80_877_104;
        } else if head[0] == b'P' {
            // Parse: the statement's name, then its query, each NUL-terminated.
            let mut parts = body.split(|b| *b == 0);
            let _name = parts.next();
            let query = String::from_utf8_lossy(parts.next().unwrap_or_default());
            log.lock().unwrap().push(query.into_owned());
        }
        if to_server.write_all(&head).await.is_err() || to_server.write_all(&body).await.is_err() {
            return;
        }
    }
}

/// The generic plan of each of `statements` that reads or writes (the plan
/// `force_generic_plan` makes a prepared statement use whatever its parameters: the one it
/// may settle on after its first executions), as `EXPLAIN` prints it, with its statement.
async fn generic_plans(client: &Client, statements: &[String]) -> Vec<(String, String)> {
    client
        .batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    let mut plans = Vec::new();
    for sql in statements {
        let verb = sql
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_ascii_uppercase();
        if !matches!(
            verb.as_str(),
            "SELECT" | "WITH" | "INSERT" | "UPDATE" | "DELETE"
        ) {
            continue;
        }
        // Parameters typed by their context, as the store's Parse messages leave them.
        client
            .batch_execute(&format!("PREPARE oncely_plan AS {sql}"))
            .await
            .unwrap_or_else(|e| panic!("PREPARE {sql}: {e}"));
        let params: i32 = client
            .query_one(
                "SELECT cardinality(parameter_types) FROM pg_prepared_statements
                 WHERE name = 'oncely_plan'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let args = if params == 0 {
            String::new()
        } else {
            format!("({})", vec!["NULL"; params as usize].join(", "))
        };
        let plan = client
            .query(&format!("EXPLAIN EXECUTE oncely_plan{args}"), &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n");
        client
            .batch_execute("DEALLOCATE oncely_plan")
            .await
            .unwrap();
        plans.push((sql.clone(), plan));
    }
    plans
}

/// Whether `plan` scans the table `records` sequentially.
fn scans_records(plan: &str) -> bool {
    plan.lines().any(|line| {
        line.split("Seq Scan on records")
            .nth(1)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
    })
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
    let recorder = Recorder::start(&url).await;
    let store = PgStore::connect(&recorder.url, StoreOptions::default())
        .await
        .unwrap();
    let (mut open, mut newest) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        let mark = recorder.mark();
        let unknown = store
            .list(&ListFilter {
                state: Some(State::OutcomeUnknown),
                ..ListFilter::default()
            })
            .await
            .unwrap();
        open.extend(recorder.since(mark));
        assert_eq!(unknown.len(), 20);
        assert!(
            unknown.windows(2).all(|w| w[0].id > w[1].id),
            "newest first"
        );
        let mark = recorder.mark();
        let list = store
            .list(&ListFilter {
                limit: Some(50),
                ..ListFilter::default()
            })
            .await
            .unwrap();
        newest.extend(recorder.since(mark));
        assert_eq!(list.len(), 50);
        assert_eq!(list[0].id.0, format!("rec_{:032x}", 20000));
    }
    drop(store);
    // The plans of the statements the lists ran (not the server's scan counters, which
    // other statements move and which reach the statistics views late).
    let open = generic_plans(&client, &open).await;
    let newest = generic_plans(&client, &newest).await;
    assert!(
        !open.is_empty() && !newest.is_empty(),
        "each list ran a statement"
    );
    for (sql, plan) in open.iter().chain(&newest) {
        assert!(
            !scans_records(plan),
            "no sequential scan of records: {sql}\n{plan}"
        );
    }
    assert!(
        open.iter().any(|(_, plan)| plan.contains("records_open")),
        "the open states through records_open: {open:?}"
    );
    assert!(
        newest.iter().any(|(_, plan)| plan.contains("records_pkey")),
        "newest first through the primary key: {newest:?}"
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
    let recorder = Recorder::start(&url).await;
    let store = PgStore::connect(&recorder.url, StoreOptions::default())
        .await
        .unwrap();
    let mark = recorder.mark();
    assert_eq!(store.purge_expired().await.unwrap(), expired as u64);
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    drop(store);
    // The plans of the statements the purge ran (not the server's scan counters, which
    // other statements, this test's count above among them, move and which reach the
    // statistics views late).
    let plans = generic_plans(&client, &recorder.since(mark)).await;
    assert!(
        plans
            .iter()
            .any(|(_, plan)| plan.contains("Delete on records")),
        "the purge's statement that deletes records was seen: {plans:?}"
    );
    for (sql, plan) in &plans {
        assert!(
            !scans_records(plan),
            "no sequential scan of records: {sql}\n{plan}"
        );
    }
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
