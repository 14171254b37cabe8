//! Ledger benchmarks: claim, claim + complete, the replay (a claim that meets a completed
//! record, as the gateway replays), the replay read (`lookup`) and a read by id, per
//! backend, at 1, 16, 64 and 256 concurrent callers.
//!
//! Run with: `cargo bench -p oncely-store --bench ledger -- sqlite`
//! (append `--warm-up-time 1 --measurement-time 3` for a quick run).
//! PostgreSQL runs when `ONCELY_TEST_PG_URL` names a server, e.g. a throwaway one:
//! `bash -c 'source scripts/pg-env && pg_start && cargo bench -p oncely-store --bench ledger -- postgres'`
//! (each run gets a fresh schema; the pool has the gateway's default 16 connections).
//!
//! Each benchmark is named `<operation>/<backend>/<callers>` and reports the time per
//! operation (and operations per second): N operations are spread over `callers` tokio
//! tasks on a multi-threaded runtime and the wall time of the whole batch is divided by
//! N, so with 64 callers it measures throughput under contention, not one call's latency.
//! A backend is an entry of [`backends`]; one that cannot be reached (no database
//! configured) is skipped.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oncely_core::{ClaimSpec, Class, RecordId, Scope};
use oncely_store::postgres::PgStore;
use oncely_store::sqlite::SqliteStore;
use oncely_store::{Claim, Store, StoreOptions};
use oncely_store_conformance::{completion, spec};
use tokio::runtime::Runtime;

/// Concurrent callers measured.
const CALLERS: [usize; 4] = [1, 16, 64, 256];

/// A store under test and whatever keeps its database alive (a temp dir).
struct Opened {
    store: Arc<dyn Store>,
    _keep: Box<dyn Any>,
}

/// A backend: its name (the filter word) and how to open a fresh store, if it can.
struct Backend {
    name: &'static str,
    open: fn(&Runtime) -> Option<Opened>,
}

/// The backends benchmarked. Add one by appending an entry.
fn backends() -> Vec<Backend> {
    vec![
        Backend {
            name: "sqlite",
            open: open_sqlite,
        },
        Backend {
            name: "postgres",
            open: open_postgres,
        },
    ]
}

/// SQLite as a gateway uses it: WAL, group commit, `synchronous=FULL` (or the mode in
/// `ONCELY_BENCH_SQLITE_SYNCHRONOUS`, e.g. `NORMAL`), in a fresh temporary directory.
fn open_sqlite(rt: &Runtime) -> Option<Opened> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.db");
    let options = StoreOptions {
        sqlite_synchronous: std::env::var("ONCELY_BENCH_SQLITE_SYNCHRONOUS")
            .unwrap_or_else(|_| "FULL".into()),
        ..StoreOptions::default()
    };
    let store = rt
        .block_on(SqliteStore::open(&path, options))
        .expect("open the SQLite ledger");
    Some(Opened {
        store: Arc::new(store),
        _keep: Box::new(dir),
    })
}

/// PostgreSQL at `ONCELY_TEST_PG_URL`, on a fresh schema, with the default pool (16).
fn open_postgres(rt: &Runtime) -> Option<Opened> {
    let base = std::env::var("ONCELY_TEST_PG_URL")
        .ok()
        .filter(|u| !u.is_empty())?;
    let store = rt.block_on(async {
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
        PgStore::connect(&url, StoreOptions::default())
            .await
            .expect("open the PostgreSQL ledger")
    });
    Some(Opened {
        store: Arc::new(store),
        _keep: Box::new(()),
    })
}

/// A route's churn windows (the defaults: 10 minutes, the 3 hours of the replay window).
const CHURN: oncely_store::Churn = oncely_store::Churn {
    window: Duration::from_secs(600),
    keep: Duration::from_secs(3 * 3600),
};

/// Keys are never reused across iterations, samples or benchmarks.
static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

/// The claim of a fresh key (the template's scope and fingerprint, a new key).
fn fresh(template: &ClaimSpec) -> ClaimSpec {
    let n = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    let mut spec = template.clone();
    spec.key = format!("bench-{n}");
    spec
}

/// Runs `iters` calls of `op` spread over `callers` tasks; returns the wall time.
async fn spread<F, Fut>(callers: usize, iters: u64, op: F) -> Duration
where
    F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers as u64)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut i = task;
                while i < iters {
                    op(i).await;
                    i += callers as u64;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench task");
    }
    started.elapsed()
}

/// The CPU time this process has used (user + system), from `/proc/self/stat`.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command name: state is field 3, utime 14 and stime 15 (clock ticks).
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// With `ONCELY_BENCH_CPU=1`: claims of fresh keys at 64 callers outside criterion, with
/// the CPU time they cost the whole process, so that figures from a busy machine can be
/// read as capacity (claims per CPU-second).
fn cpu_cost(rt: &Runtime, store: &Arc<dyn Store>, template: &ClaimSpec, backend: &str) {
    if std::env::var_os("ONCELY_BENCH_CPU").is_none() {
        return;
    }
    const CLAIMS: u64 = 20_000;
    let (cpu_before, store, template) = (process_cpu(), store.clone(), template.clone());
    let wall = rt.block_on(spread(64, CLAIMS, move |_| {
        let (store, spec) = (store.clone(), fresh(&template));
        async move {
            store.claim(&spec).await.expect("claim");
        }
    }));
    if let (Some(before), Some(after)) = (cpu_before, process_cpu()) {
        let cpu = after.saturating_sub(before);
        eprintln!(
            "cpu/{backend}/64: {CLAIMS} claims in {wall:.2?} wall ({:.0}/s), {cpu:.2?} CPU \
             ({:.1} us CPU a claim, {:.0} claims per CPU-second)",
            CLAIMS as f64 / wall.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / CLAIMS as f64,
            CLAIMS as f64 / cpu.as_secs_f64().max(1e-9),
        );
    }
}

fn ledger(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let template = spec("bench", "k", "{\"n\":1}", Class::Write, "bench-owner");
    for backend in backends() {
        let Some(opened) = (backend.open)(&rt) else {
            eprintln!(
                "skipping the {} ledger benchmarks: not configured",
                backend.name
            );
            continue;
        };
        let store = opened.store.clone();
        cpu_cost(&rt, &store, &template, backend.name);

        let mut group = c.benchmark_group("claim");
        group.throughput(Throughput::Elements(1)).sample_size(10);
        for callers in CALLERS {
            group.bench_function(BenchmarkId::new(backend.name, callers), |b| {
                b.iter_custom(|iters| {
                    let (store, template) = (store.clone(), template.clone());
                    rt.block_on(spread(callers, iters, move |_| {
                        let (store, spec) = (store.clone(), fresh(&template));
                        async move {
                            let claim = store.claim(&spec).await.expect("claim");
                            assert!(matches!(claim, Claim::Owned(_)));
                        }
                    }))
                })
            });
        }
        group.finish();

        let mut group = c.benchmark_group("claim_complete");
        group.throughput(Throughput::Elements(1)).sample_size(10);
        for callers in CALLERS {
            group.bench_function(BenchmarkId::new(backend.name, callers), |b| {
                b.iter_custom(|iters| {
                    let (store, template) = (store.clone(), template.clone());
                    rt.block_on(spread(callers, iters, move |_| {
                        let (store, spec) = (store.clone(), fresh(&template));
                        async move {
                            let Claim::Owned(r) = store.claim(&spec).await.expect("claim") else {
                                panic!("a fresh key is owned")
                            };
                            store
                                .complete(&r.fence().expect("fence"), completion("{\"ok\":1}", 1))
                                .await
                                .expect("complete");
                        }
                    }))
                })
            });
        }
        group.finish();

        // The same through the claim of a route that recognises made-up keys
        // (`oncely_store::churn::claim`): with nothing undelivered (the filter empty), then
        // with 1000 records of other fingerprints undelivered (two hash probes in memory).
        // The fresh path must cost what it did: no B-tree of the ledger is read for it.
        for (name, undelivered) in [
            ("claim_complete_churn", 0),
            ("claim_complete_churn_busy", 1000),
        ] {
            rt.block_on(async {
                for i in 0..undelivered {
                    let spec = spec(
                        "bench",
                        &format!("u{i}"),
                        &format!("{{\"u\":{i}}}"),
                        Class::Write,
                        "o",
                    );
                    let Claim::Owned(r) = store.claim(&spec).await.expect("claim") else {
                        panic!("a fresh key is owned")
                    };
                    let now = store.now().await.expect("now");
                    store
                        .churn_put(&oncely_store::churn::undelivered(&r, CHURN, now))
                        .await
                        .expect("undelivered");
                }
            });
            let mut group = c.benchmark_group(name);
            group.throughput(Throughput::Elements(1)).sample_size(10);
            for callers in CALLERS {
                group.bench_function(BenchmarkId::new(backend.name, callers), |b| {
                    b.iter_custom(|iters| {
                        let (store, template) = (store.clone(), template.clone());
                        rt.block_on(spread(callers, iters, move |_| {
                            let (store, spec) = (store.clone(), fresh(&template));
                            async move {
                                let (claim, _) =
                                    oncely_store::churn::claim(&*store, &spec, CHURN, &|| false)
                                        .await
                                        .expect("claim");
                                let Claim::Owned(r) = claim else {
                                    panic!("a fresh key is owned")
                                };
                                store
                                    .complete(
                                        &r.fence().expect("fence"),
                                        completion("{\"ok\":1}", 1),
                                    )
                                    .await
                                    .expect("complete");
                            }
                        }))
                    })
                });
            }
            group.finish();
        }

        // One completed record per caller, looked up again and again: what a replay reads.
        let completed: Arc<Vec<(Scope, String, RecordId, ClaimSpec)>> =
            Arc::new(rt.block_on(async {
                let mut out = Vec::new();
                for _ in 0..64 {
                    let spec = fresh(&template);
                    let Claim::Owned(r) = store.claim(&spec).await.expect("claim") else {
                        panic!("a fresh key is owned")
                    };
                    let body = "{\"audio\":\"https://cdn.example/a.mp3\",\"seconds\":12.5}";
                    store
                        .complete(&r.fence().expect("fence"), completion(body, 1))
                        .await
                        .expect("complete");
                    out.push((spec.scope.clone(), spec.key.clone(), r.id, spec));
                }
                out
            }));
        let mut group = c.benchmark_group("replay_claim");
        group.throughput(Throughput::Elements(1)).sample_size(10);
        for callers in CALLERS {
            group.bench_function(BenchmarkId::new(backend.name, callers), |b| {
                b.iter_custom(|iters| {
                    let (store, completed) = (store.clone(), completed.clone());
                    rt.block_on(spread(callers, iters, move |i| {
                        let (store, completed) = (store.clone(), completed.clone());
                        async move {
                            let (_, _, _, spec) = &completed[(i % 64) as usize];
                            let claim = store.claim(spec).await.expect("claim");
                            assert!(matches!(claim, Claim::Existing(r) if r.response.is_some()));
                        }
                    }))
                })
            });
        }
        group.finish();

        let mut group = c.benchmark_group("replay_read");
        group.throughput(Throughput::Elements(1)).sample_size(10);
        for callers in CALLERS {
            group.bench_function(BenchmarkId::new(backend.name, callers), |b| {
                b.iter_custom(|iters| {
                    let (store, completed) = (store.clone(), completed.clone());
                    rt.block_on(spread(callers, iters, move |i| {
                        let (store, completed) = (store.clone(), completed.clone());
                        async move {
                            let (scope, key, _, _) = &completed[(i % 64) as usize];
                            let r = store.lookup(scope, key).await.expect("lookup");
                            assert!(r.is_some_and(|r| r.response.is_some()));
                        }
                    }))
                })
            });
        }
        group.finish();

        // The same records by id: a read that goes to the database every time (for
        // SQLite, a read connection on a blocking thread), as `get` and `list` do.
        let mut group = c.benchmark_group("read_by_id");
        group.throughput(Throughput::Elements(1)).sample_size(10);
        for callers in CALLERS {
            group.bench_function(BenchmarkId::new(backend.name, callers), |b| {
                b.iter_custom(|iters| {
                    let (store, completed) = (store.clone(), completed.clone());
                    rt.block_on(spread(callers, iters, move |i| {
                        let (store, completed) = (store.clone(), completed.clone());
                        async move {
                            let (_, _, id, _) = &completed[(i % 64) as usize];
                            let r = store.get(id).await.expect("get");
                            assert!(r.is_some_and(|r| r.response.is_some()));
                        }
                    }))
                })
            });
        }
        group.finish();
        drop(store);
        drop(opened);
    }
}

criterion_group!(benches, ledger);
criterion_main!(benches);
