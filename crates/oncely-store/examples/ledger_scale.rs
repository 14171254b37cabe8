//! Does the ledger keep its speed as it grows, and while a big purge runs? Three phases,
//! one store, fresh claim + complete from C concurrent callers (keys as random as
//! fingerprints), each phase N requests:
//!
//! 1. on an empty ledger;
//! 2. with PRELOAD records already in it (written straight into the store's tables, as
//!    the store writes them: one in ten of them past its window, the rest completed and
//!    live, spread over 1,000 principals);
//! 3. the same load again while `purge_expired` removes the expired tenth.
//!
//! It prints req/s and the p50/p99 latency of each phase, and the two ratios issue 28
//! sets goals for: throughput at PRELOAD records against the empty ledger (goal >= 0.8x),
//! and the p99 during the purge against the p99 without it (goal <= 2x).
//!
//! `cargo run --release -p oncely-store --example ledger_scale -- STORE [PRELOAD] [N] [C]`
//! where STORE is `sqlite` (a temporary file) or a `postgres://` URL of an empty database.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncely_core::Scope;
use oncely_store::{Store, StoreOptions};
use oncely_store_conformance::fresh_request;

/// The key of fresh request `i` (see `writer_cost`).
fn key(i: u64) -> String {
    Scope::new(&i.to_string(), "ledger_scale")
        .as_str()
        .to_string()
}

/// One phase: `n` fresh requests from `callers`; returns req/s and the sorted latencies.
async fn phase(
    store: &Arc<dyn Store>,
    next: &Arc<AtomicU64>,
    n: u64,
    callers: u64,
) -> (f64, Vec<Duration>) {
    let end = next.load(Ordering::Relaxed) + n;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (store, next) = (store.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return took;
                }
                let t = Instant::now();
                fresh_request(&*store, "p_scale", &key(i), i).await;
                took.push(t.elapsed());
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("caller"));
    }
    let wall = started.elapsed();
    all.sort();
    (all.len() as f64 / wall.as_secs_f64(), all)
}

/// The `q` quantile of sorted latencies, in ms.
fn ms(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The preloaded records' keys, principals and claim hashes, in claim-hash order: record
/// `rank` of this order gets id `rank`, so that the preload appends to both the table
/// (keyed by id) and the claim index instead of writing them at random. What is
/// measured afterwards (new claims at random places of a big index) is not affected.
fn preload_rows(count: u64) -> Vec<([u8; 16], u64)> {
    let scopes = scopes();
    let mut rows: Vec<([u8; 16], u64)> = (0..count)
        .map(|i| {
            let scope = Scope::from_stored(scopes[(i % 1000) as usize].clone());
            (scope.claim_hash(&preload_key(i)), i)
        })
        .collect();
    rows.sort_unstable();
    rows
}

/// The scopes of the 1,000 principals of the preload.
fn scopes() -> Vec<String> {
    (0..1000)
        .map(|p| {
            Scope::new(&format!("p{p}"), "POST /v1/render")
                .as_str()
                .to_string()
        })
        .collect()
}

/// The key of preloaded record `i`.
fn preload_key(i: u64) -> String {
    format!("{:064x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Writes `count` completed records into a SQLite ledger file, as the store writes them,
/// one in ten expired at `now`.
fn preload_sqlite(path: &std::path::Path, count: u64, now: i64) {
    let conn = rusqlite::Connection::open(path).expect("open");
    conn.execute_batch("PRAGMA synchronous = OFF")
        .expect("pragma");
    let scopes = scopes();
    let rows = preload_rows(count);
    for (n, chunk) in rows.chunks(100_000).enumerate() {
        let tx = conn.unchecked_transaction().expect("tx");
        {
            let mut st = tx
                .prepare(
                    "INSERT INTO records (id, claim, scope, key, fingerprint, class, route, \
                     principal, state, owner, attempt, created_at, updated_at, completed_at, \
                     expires_at, units, status, headers, body) \
                     VALUES (?1, ?2, ?3, ?4, ?4, 'write', 'POST /v1/render', \
                     ?5, 'completed', 'preload', 1, ?6, ?6, ?6, ?7, 1, 200, \
                     '[[\"content-type\",\"application/json\"]]', ?8)",
                )
                .expect("prepare");
            for (j, (claim, i)) in chunk.iter().enumerate() {
                let rank = n * 100_000 + j;
                let created = now - 3_600_000 + (*i as i64 % 3_600_000);
                let expires = if i % 10 == 0 {
                    now - 1
                } else {
                    now + 86_400_000
                };
                let p = (i % 1000) as usize;
                st.execute(rusqlite::params![
                    format!("rec_{rank:032x}"),
                    &claim[..],
                    scopes[p],
                    preload_key(*i),
                    format!("p{p}"),
                    created,
                    expires,
                    &b"{\"id\":\"r-preloaded\",\"ok\":true,\"result\":\"0123456789abcdef\"}"[..],
                ])
                .expect("insert");
            }
        }
        tx.commit().expect("commit");
        eprintln!("preloaded {} of {count}", (n + 1) * 100_000);
    }
    // On disk before the load starts: the kernel's writeback of the preload must not
    // compete with the measured phase.
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .expect("checkpoint");
    drop(conn);
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .expect("sync");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_else(|| "sqlite".into());
    let preload: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(30_000);
    let callers: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("scale.db");
    let url = if target == "sqlite" {
        format!("sqlite://{}", path.display())
    } else {
        target.clone()
    };
    let open = || {
        rt.block_on(oncely_store::open(&url, StoreOptions::default()))
            .expect("open the store")
    };
    let next = Arc::new(AtomicU64::new(0));
    let store = open();
    rt.block_on(phase(&store, &next, n / 10, callers));
    let (empty, lat_empty) = rt.block_on(phase(&store, &next, n, callers));
    let now = rt.block_on(store.now()).expect("now").0;
    drop(store);
    let started = Instant::now();
    if target == "sqlite" {
        preload_sqlite(&path, preload, now);
    } else {
        rt.block_on(preload_postgres(&url, preload, now));
    }
    eprintln!("preloaded {preload} records in {:.0?}", started.elapsed());
    let store = open();
    rt.block_on(phase(&store, &next, n / 10, callers));
    let (full, lat_full) = rt.block_on(phase(&store, &next, n, callers));
    let purger = {
        let store = store.clone();
        rt.spawn(async move {
            let t = Instant::now();
            let gone = store.purge_expired().await.expect("purge");
            (gone, t.elapsed())
        })
    };
    let (during, lat_during) = rt.block_on(phase(&store, &next, n, callers));
    let (gone, purge_took) = rt.block_on(purger).expect("purge task");
    println!(
        "empty ledger: {empty:.0} req/s, p50 {:.2} ms, p99 {:.2} ms",
        ms(&lat_empty, 0.5),
        ms(&lat_empty, 0.99)
    );
    println!(
        "{preload} records: {full:.0} req/s, p50 {:.2} ms, p99 {:.2} ms; {:.2}x the empty \
         ledger's throughput (goal >= 0.8x: {})",
        ms(&lat_full, 0.5),
        ms(&lat_full, 0.99),
        full / empty,
        if full / empty >= 0.8 { "met" } else { "missed" }
    );
    let p99 = ms(&lat_during, 0.99) / ms(&lat_full, 0.99);
    println!(
        "during a purge of {gone} expired records (it took {purge_took:.1?}): {during:.0} \
         req/s, p50 {:.2} ms, p99 {:.2} ms; p99 {p99:.2}x the p99 without it (goal <= 2x: {})",
        ms(&lat_during, 0.5),
        ms(&lat_during, 0.99),
        if p99 <= 2.0 { "met" } else { "missed" }
    );
    if purge_took > Duration::ZERO && gone < preload / 10 {
        println!("note: the purge was still running when the load ended ({gone} records)");
    }
}

/// Writes `count` completed records into the PostgreSQL ledger, as the store writes them
/// (in claim-hash order, see [`preload_rows`]), one in ten expired at `now`.
async fn preload_postgres(url: &str, count: u64, now: i64) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let scopes = scopes();
    let rows = preload_rows(count);
    let sql = format!(
        "INSERT INTO records (id, claim, scope, key, fingerprint, class, route, principal, \
         state, owner, attempt, created_at, updated_at, completed_at, expires_at, units, \
         response_status, response_headers, response_body) \
         SELECT 'rec_' || lpad(to_hex(r.rank), 32, '0'), r.claim, r.scope, r.key, \
                decode(r.key, 'hex'), 'write', 'POST /v1/render', r.principal, 'completed', \
                'preload', 1, r.created, r.created, r.created, \
                CASE WHEN r.expired THEN {now} - 1 ELSE {now} + 86400000 END, 1, 200, \
                '[[\"content-type\",\"application/json\"]]', \
                convert_to('{{\"id\":\"r-preloaded\",\"ok\":true,\"result\":\"0123456789abcdef\"}}', 'UTF8') \
         FROM unnest($1::bigint[], $2::bytea[], $3::text[], $4::text[], $5::text[], \
                     $6::bigint[], $7::bool[]) \
              AS r(rank, claim, scope, key, principal, created, expired)"
    );
    let st = client.prepare(&sql).await.expect("prepare");
    for (n, chunk) in rows.chunks(50_000).enumerate() {
        let mut ranks = Vec::new();
        let mut claims = Vec::new();
        let mut scope_col = Vec::new();
        let mut keys = Vec::new();
        let mut principals = Vec::new();
        let mut created = Vec::new();
        let mut expired = Vec::new();
        for (j, (claim, i)) in chunk.iter().enumerate() {
            let p = (i % 1000) as usize;
            ranks.push((n * 50_000 + j) as i64);
            claims.push(claim.to_vec());
            scope_col.push(scopes[p].clone());
            keys.push(preload_key(*i));
            principals.push(format!("p{p}"));
            created.push(now - 3_600_000 + (*i as i64 % 3_600_000));
            expired.push(i % 10 == 0);
        }
        client
            .execute(
                &st,
                &[
                    &ranks,
                    &claims,
                    &scope_col,
                    &keys,
                    &principals,
                    &created,
                    &expired,
                ],
            )
            .await
            .expect("preload");
        if (n + 1) % 20 == 0 {
            eprintln!("preloaded {} of {count}", (n + 1) * 50_000);
        }
    }
    for sql in ["VACUUM ANALYZE records", "CHECKPOINT"] {
        client.batch_execute(sql).await.expect(sql);
    }
}
