//! Reading a year of usage history: 10,000 principals, each with one route active in one
//! hour a day for 365 days (3.65 million rows of `usage_hours`), read as `oncely usage
//! --since 365d` does (`Admin::usage`, per principal) and as one principal's statement does
//! (`Admin::repeat_events`). The history is written straight into the table (as a year of
//! purges would have left it), then each read is timed.
//!
//! Run with: `cargo bench -p oncely-store --bench usage -- sqlite`, and for PostgreSQL
//! `bash -c 'source scripts/pg-env && pg_start && cargo bench -p oncely-store --bench usage -- postgres'`.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use oncely_store::postgres::PgStore;
use oncely_store::sqlite::SqliteStore;
use oncely_store::{Ledger, Store, StoreOptions};
use tokio::runtime::Runtime;

const PRINCIPALS: i64 = 10_000;
const DAYS: i64 = 365;
const HOUR: i64 = 3_600_000;

/// The history's rows for a year, ending now, as one SQL statement (`$NOW` replaced).
fn fill_sql(series: &str, now: i64) -> String {
    let start = (now / HOUR) * HOUR - DAYS * 24 * HOUR;
    format!(
        "INSERT INTO usage_hours (hour, principal, route, fresh, fresh_units, repeats,
                                  repeat_units, joined, replayed)
         SELECT {start} + CAST(d AS BIGINT) * 24 * {HOUR} + CAST(p % 24 AS BIGINT) * {HOUR}, 'principal-' || p,
                'POST /v1/render', 3, 30, 1, 10, 0, 1
         FROM {series}"
    )
}

fn sqlite(rt: &Runtime) -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.db");
    let store = rt
        .block_on(SqliteStore::open(&path, StoreOptions::default()))
        .expect("open the SQLite ledger");
    let now = rt.block_on(store.now()).expect("now").0;
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.execute_batch(&format!(
        "WITH RECURSIVE p(p) AS (SELECT 0 UNION ALL SELECT p + 1 FROM p WHERE p < {}),
              d(d) AS (SELECT 0 UNION ALL SELECT d + 1 FROM d WHERE d < {})
         {}",
        PRINCIPALS - 1,
        DAYS - 1,
        fill_sql("p, d", now)
    ))
    .expect("fill the history");
    (Arc::new(store), dir)
}

fn postgres(rt: &Runtime) -> Option<Arc<dyn Store>> {
    let base = std::env::var("ONCELY_TEST_PG_URL")
        .ok()
        .filter(|u| !u.is_empty())?;
    Some(rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .expect("connect to ONCELY_TEST_PG_URL");
        tokio::spawn(connection);
        let schema = format!("bench_{}", uuid::Uuid::now_v7().simple());
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .expect("create the bench schema");
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
        let store = PgStore::connect(&url, StoreOptions::default())
            .await
            .expect("open the PostgreSQL ledger");
        let now = store.now().await.expect("now").0;
        client
            .batch_execute(&format!(
                "SET search_path = {schema}; {}; ANALYZE usage_hours",
                fill_sql(
                    &format!(
                        "generate_series(0, {}) p, generate_series(0, {}) d",
                        PRINCIPALS - 1,
                        DAYS - 1
                    ),
                    now
                )
            ))
            .await
            .expect("fill the history");
        Arc::new(store) as Arc<dyn Store>
    }))
}

fn reads(c: &mut Criterion, rt: &Runtime, name: &str, store: &Arc<dyn Store>) {
    let since = rt
        .block_on(store.now())
        .expect("now")
        .minus(Duration::from_secs(DAYS as u64 * 86_400));
    let usage = rt.block_on(store.usage(Some(since))).expect("usage");
    assert_eq!(usage.by_principal.len() as i64, PRINCIPALS);
    assert_eq!(usage.totals.fresh as i64, PRINCIPALS * DAYS * 3);
    let mut group = c.benchmark_group(format!("usage_year/{name}"));
    group.sample_size(10);
    group.bench_function("per_principal", |b| {
        b.iter(|| rt.block_on(store.usage(Some(since))).expect("usage"))
    });
    group.bench_function("one_statement", |b| {
        b.iter(|| {
            rt.block_on(store.repeat_events("principal-4242", Some(since), 1000))
                .expect("statement")
        })
    });
    group.finish();
}

fn usage_year(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |name: &str| {
        filter
            .as_deref()
            .is_none_or(|f| f.contains(name) || name.contains(f))
    };
    if wants("sqlite") {
        let (store, _dir) = sqlite(&rt);
        reads(c, &rt, "sqlite", &store);
    }
    if wants("postgres") {
        if let Some(store) = postgres(&rt) {
            reads(c, &rt, "postgres", &store);
        }
    }
}

criterion_group!(benches, usage_year);
criterion_main!(benches);
