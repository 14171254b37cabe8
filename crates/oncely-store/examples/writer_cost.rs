//! What one fresh request costs the SQLite writer thread: runs claim + complete for N
//! fresh keys from C concurrent callers and reports, per request, the writer thread's
//! CPU time and the bytes it wrote (WAL frames), and the checkpointer's, read from
//! `/proc/self/task/*/{stat,io}` (Linux). CPU time per request is what bounds the fresh
//! path under load, and unlike throughput it holds on a busy machine.
//!
//! `cargo run --release -p oncely-store --example writer_cost -- [N] [CALLERS]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use oncely_store::sqlite::SqliteStore;
use oncely_store::{Store, StoreOptions};
use oncely_store_conformance::fresh_request;

/// CPU ticks (utime + stime) and bytes written of every thread whose name starts with
/// `prefix` (every thread: `""`).
fn thread_cost(prefix: &str) -> (u64, u64) {
    let mut ticks = 0;
    let mut written = 0;
    for entry in std::fs::read_dir("/proc/self/task").expect("/proc") {
        let dir = entry.expect("task").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.trim().starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // Fields after the ")" of the name: state is field 3; utime 14, stime 15.
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        ticks += fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        let io = std::fs::read_to_string(dir.join("io")).unwrap_or_default();
        for line in io.lines() {
            if let Some(v) = line.strip_prefix("wchar: ") {
                written += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    (ticks, written)
}

/// The key of fresh request `i`: 64 hex digits, as the fingerprint of a request without
/// an `Idempotency-Key` (and as random as a client's UUID key), so that the ledger's key
/// index is written where real keys would write it, not in order.
fn key(i: u64) -> String {
    oncely_core::Scope::new(&i.to_string(), "writer_cost")
        .as_str()
        .to_string()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let callers: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(
        rt.block_on(SqliteStore::open(
            &dir.path().join("cost.db"),
            StoreOptions::default(),
        ))
        .expect("open"),
    );
    let tick_us = 1_000_000 / 100; // USER_HZ is 100 on Linux
    let next = Arc::new(AtomicU64::new(0));
    let run = |count: u64| {
        let started = Instant::now();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..callers {
                let store = store.clone();
                let next = next.clone();
                let end = next.load(Ordering::Relaxed) + count;
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= end {
                            break;
                        }
                        fresh_request(&*store, "p_bench", &key(i), i).await;
                    }
                }));
            }
            for t in tasks {
                t.await.expect("caller");
            }
        });
        started.elapsed()
    };
    // Warm up (pages, statement caches), then measure.
    run(n / 10);
    let (w0, b0) = thread_cost("oncely-sqlite-w");
    let (c0, cb0) = thread_cost("oncely-sqlite-c");
    let (s0, _) = thread_cost("oncely-sqlite-s");
    let (t0, _) = thread_cost("");
    let done_before = next.load(Ordering::Relaxed);
    let wall = run(n);
    let done = next.load(Ordering::Relaxed) - done_before;
    let (w1, b1) = thread_cost("oncely-sqlite-w");
    let (c1, cb1) = thread_cost("oncely-sqlite-c");
    let (s1, _) = thread_cost("oncely-sqlite-s");
    let (t1, _) = thread_cost("");
    let per = |v: u64| v as f64 / done as f64;
    println!(
        "requests {done} callers {callers}: {:.0} req/s; writer {:.1} us CPU and {:.0} bytes \
         written per request; checkpointer {:.1} us CPU and {:.0} bytes per request; \
         syncer {:.1} us CPU; the whole process (callers included) {:.1} us CPU per request",
        done as f64 / wall.as_secs_f64(),
        per((w1 - w0) * tick_us),
        per(b1 - b0),
        per((c1 - c0) * tick_us),
        per(cb1 - cb0),
        per((s1 - s0) * tick_us),
        per((t1 - t0) * tick_us),
    );
}
