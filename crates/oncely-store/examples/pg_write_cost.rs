//! What one fresh request costs the PostgreSQL server: runs claim + complete for N fresh
//! keys from C concurrent callers against the store at `ONCELY_TEST_PG_URL` and reports,
//! per request, the server's CPU time (utime + stime of every `postgres` process, read
//! from `/proc` before and after: run it on the server's host, Linux), the WAL it wrote,
//! the rows the ledger's tables took (inserts, updates, HOT updates), how much its
//! indexes grew, and the throughput. The PostgreSQL twin of `writer_cost`;
//! `scripts/pg-write-cost` starts a throwaway server and runs it.
//!
//! `ONCELY_TEST_PG_URL=postgres://... cargo run --release -p oncely-store --example pg_write_cost -- [N] [CALLERS]`

#[cfg(feature = "postgres")]
mod cost {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use oncely_store::postgres::PgStore;
    use oncely_store::{Store, StoreOptions};
    use oncely_store_conformance::fresh_request;
    use tokio_postgres::{Client, NoTls};

    /// CPU ticks (utime + stime) of every process named `postgres`, per kind: the
    /// backends (connections) and each background process by its title.
    fn server_ticks() -> BTreeMap<String, u64> {
        let mut ticks = BTreeMap::new();
        for entry in std::fs::read_dir("/proc").expect("/proc") {
            let dir = entry.expect("proc entry").path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if comm.trim() != "postgres" {
                continue;
            }
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            // Fields after the ")" of the name: state is field 3; utime 14, stime 15.
            let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if fields.len() <= 12 {
                continue;
            }
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            let title = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let kind = match title.strip_prefix("postgres: ") {
                // "postgres: USER DB HOST(PORT) STATE": a connection's backend.
                Some(t) if t.contains('(') => "backends".to_string(),
                Some(t) => t.split_whitespace().take(2).collect::<Vec<_>>().join(" "),
                None => "postmaster".to_string(),
            };
            let user = fields[11].parse::<u64>().unwrap_or(0);
            let system = fields[12].parse::<u64>().unwrap_or(0);
            *ticks.entry(kind).or_default() += user + system;
            // Also counted apart: the kernel's share (sends, receives, WAL flushes).
            *ticks.entry("(of which system)".to_string()).or_default() += system;
        }
        ticks
    }

    /// What the server's statistics say about the ledger's tables and the WAL.
    #[derive(Default)]
    struct Stats {
        wal: i64,
        /// Per table: inserted, updated, HOT-updated rows, and its indexes' bytes.
        tables: BTreeMap<String, [i64; 4]>,
    }

    async fn stats(client: &Client) -> Stats {
        let wal: i64 = client
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
                &[],
            )
            .await
            .expect("wal position")
            .get(0);
        let rows = client
            .query(
                "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd,
                        pg_indexes_size(relid)
                 FROM pg_stat_user_tables
                 WHERE relname IN ('records', 'record_responses', 'repeat_events')
                   AND schemaname = current_schema()",
                &[],
            )
            .await
            .expect("table statistics");
        let tables = rows
            .iter()
            .map(|r| (r.get(0), [r.get(1), r.get(2), r.get(3), r.get(4)]))
            .collect();
        Stats { wal, tables }
    }

    /// Runs `count` fresh claim + complete from `callers` tasks; returns the wall time and
    /// each request's (claim to completion) latency, sorted.
    async fn run(
        store: &Arc<dyn Store>,
        next: &Arc<AtomicU64>,
        count: u64,
        callers: u64,
    ) -> (Duration, Vec<Duration>) {
        let started = Instant::now();
        // Exactly the numbers up to `end` run (each caller also takes one past it).
        let end = next.load(Ordering::Relaxed) + count;
        let mut tasks = Vec::new();
        for _ in 0..callers {
            let store = store.clone();
            let next = next.clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        break;
                    }
                    let sent = Instant::now();
                    fresh_request(&*store, "p_bench", &format!("fresh-{i}"), i).await;
                    latencies.push(sent.elapsed());
                }
                latencies
            }));
        }
        let mut latencies = Vec::new();
        for t in tasks {
            latencies.extend(t.await.expect("caller"));
        }
        latencies.sort();
        (started.elapsed(), latencies)
    }

    pub(super) async fn main() {
        let mut args = std::env::args().skip(1);
        let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
        let callers: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
        let url = std::env::var("ONCELY_TEST_PG_URL").expect("ONCELY_TEST_PG_URL");
        let (client, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
        tokio::spawn(connection);
        let open = || async {
            let store: Arc<dyn Store> = Arc::new(
                PgStore::connect(&url, StoreOptions::default())
                    .await
                    .expect("open"),
            );
            store
        };
        let next = Arc::new(AtomicU64::new(0));
        // Warm up (the schema, pages, statement caches), then close every connection so
        // that their statistics are flushed before the first reading.
        {
            let store = open().await;
            run(&store, &next, n / 10, callers).await;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = stats(&client).await;
        let store = open().await;
        let cpu0 = server_ticks();
        let (wall, latencies) = run(&store, &next, n, callers).await;
        let cpu1 = server_ticks();
        let done = n;
        drop(store);
        // Closed connections flush their statistics; give them a moment.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let after = stats(&client).await;
        let tick_us = 1_000_000 / 100; // USER_HZ is 100 on Linux
        let per = |v: i64| v as f64 / done as f64;
        let spent = |kind: &String| {
            let ticks = cpu1[kind] - cpu0.get(kind).copied().unwrap_or(0);
            (ticks * tick_us) as i64
        };
        println!(
            "requests {done} callers {callers}: {:.0} req/s; server {:.1} us CPU per request; \
             WAL {:.0} bytes per request",
            done as f64 / wall.as_secs_f64(),
            per(cpu1.keys().filter(|k| !k.starts_with('(')).map(spent).sum()),
            per(after.wal - before.wal),
        );
        let kinds: Vec<String> = cpu1
            .keys()
            .filter(|k| spent(k) > 0)
            .map(|k| format!("{k} {:.1}", per(spent(k))))
            .collect();
        println!("  us CPU per request by process: {}", kinds.join(", "));
        let at =
            |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
        println!(
            "  latency (claim + complete): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            at(0.5),
            at(0.99),
            at(1.0)
        );
        for (table, a) in &after.tables {
            let b = before.tables.get(table).copied().unwrap_or_default();
            let (ins, upd, hot) = (a[0] - b[0], a[1] - b[1], a[2] - b[2]);
            let hot_ratio = if upd > 0 {
                format!("{:.0}%", 100.0 * hot as f64 / upd as f64)
            } else {
                "-".into()
            };
            println!(
                "  {table}: {:.2} inserts, {:.2} updates ({:.2} HOT, ratio {hot_ratio}), \
                 indexes +{:.0} bytes per request",
                per(ins),
                per(upd),
                per(hot),
                per(a[3] - b[3]),
            );
        }
    }
}

#[cfg(feature = "postgres")]
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(cost::main());
}

#[cfg(not(feature = "postgres"))]
fn main() {
    eprintln!("pg_write_cost needs the `postgres` feature");
}
