//! The usage history is exact under the races that fold it, through the real binary:
//! repeats answered up to the end of their records' windows while `oncely ledger purge
//! --expired` runs in a loop beside the gateway (a repeat flushed after its record was
//! purged still counts), a gateway killed with SIGKILL between its flush and the purge,
//! and two gateways on one PostgreSQL purging while both answer (which also found a claim
//! that became nobody's: a batch of claims handed a claimant the row a purge had just
//! deleted instead of the one it inserted, and it waited on its own record until the lease
//! lapsed; every answer there must be a 200). Every answer the callers got is counted once
//! in `oncely usage`: fresh ones as executions, replayed and joined
//! ones as repeats. And `oncely migrate` upgrades a ledger of the previous schema without
//! losing what its records counted.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;

use crate::common::{post as http_post, run, stderr, stdout, upstream, Gateway};

const AUTH: [(&str, &str); 1] = [("authorization", "Bearer sk_usage")];

/// An upstream that answers every call at once and counts them.
async fn counting_upstream() -> (String, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    let c = calls.clone();
    let router = axum::Router::new().route(
        "/v1/x",
        post(move |body: String| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                format!("done: {body}")
            }
        }),
    );
    (format!("http://{}", upstream(router).await), calls)
}

fn config(dir: &std::path::Path, store: &str, upstream: &str) -> String {
    let path = dir.join("oncely.toml");
    std::fs::write(
        &path,
        format!(
            r#"store = "{store}"
upstream = "{upstream}"

[[routes]]
method = "POST"
path = "/v1/x"
class = "write"
key = "header"
principal = "header:authorization"
window = "1s"
units = "body_bytes"
"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

/// What the callers were answered: executions and repeats.
#[derive(Default)]
struct Answered {
    fresh: AtomicU64,
    repeats: AtomicU64,
    /// Any other answer (none expected).
    others: std::sync::Mutex<Vec<String>>,
}

impl Answered {
    /// Asserts that every answer was a 200, with the gateways' logs if not.
    fn all_ok(&self, gateways: &[&Gateway]) {
        let others = self.others.lock().unwrap();
        if !others.is_empty() {
            let logs: Vec<String> = gateways
                .iter()
                .map(|g| g.lines.lock().unwrap().join("\n"))
                .collect();
            panic!(
                "answers other than 200: {others:?}\n{}",
                logs.join("\n---\n")
            );
        }
    }
}

/// `rounds` rounds over `keys` keys: each round sends every key a few times at once,
/// through the gateways in turn, 150 ms apart, so that repeats keep arriving until and
/// past each record's 1 s window (then the key executes afresh, renewing it in place).
async fn traffic(gateways: &[String], keys: usize, rounds: usize, answered: &Answered) {
    for round in 0..rounds {
        let mut calls = Vec::new();
        for k in 0..keys {
            for copy in 0..3 {
                let url = gateways[(k + copy + round) % gateways.len()].clone();
                calls.push(tokio::spawn(async move {
                    let key = format!("key-{k}");
                    let headers = [AUTH[0], ("idempotency-key", key.as_str())];
                    // Five bytes: five units a call.
                    http_post(&url, &format!("job-{k}"), &headers).await
                }));
            }
        }
        for c in calls {
            let a = c.await.unwrap();
            if a.status != 200 {
                answered.others.lock().unwrap().push(a.text());
                continue;
            }
            match a.header("oncely-status") {
                "fresh" => answered.fresh.fetch_add(1, Ordering::SeqCst),
                "replayed" | "joined" => answered.repeats.fetch_add(1, Ordering::SeqCst),
                other => panic!("unexpected oncely-status {other:?}"),
            };
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// `oncely ledger purge --expired` every 50 ms until `stop`, in a thread of its own.
fn purging(store: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        let mut runs = 0;
        while !stop.load(Ordering::SeqCst) {
            let out = run(&["ledger", "purge", "--expired", "--store", &store]);
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            runs += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        runs
    })
}

/// `oncely usage --json` totals: (fresh, fresh_units, repeats, repeat_units).
fn usage(store: &str) -> (u64, u64, u64, u64) {
    let out = run(&["usage", "--json", "--since", "30d", "--store", store]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let t = &v["totals"];
    let n = |k: &str| t[k].as_u64().unwrap();
    (
        n("fresh"),
        n("fresh_units"),
        n("repeats"),
        n("repeat_units"),
    )
}

/// Waits past the windows, purges everything that ended, and checks that usage counts
/// every answer once.
async fn settled_usage_matches(store: &str, answered: &Answered, executed: u64) {
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let out = run(&["ledger", "purge", "--expired", "--store", store]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let fresh = answered.fresh.load(Ordering::SeqCst);
    let repeats = answered.repeats.load(Ordering::SeqCst);
    assert_eq!(fresh, executed, "each fresh answer is one execution");
    assert_eq!(
        usage(store),
        (fresh, 5 * fresh, repeats, 5 * repeats),
        "usage = (fresh, 5 units each, repeats, 5 units each) as answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeats_flushed_while_a_purge_loop_runs_are_all_counted_once() {
    let (up, calls) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = config(dir.path(), &store, &up);
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let purger = purging(store.clone(), stop.clone());
    let answered = Answered::default();
    traffic(&[gw.url("/v1/x")], 8, 14, &answered).await;
    answered.all_ok(&[&gw]);
    // SIGTERM drains: the last repeats counted in memory are written.
    assert!(gw.terminate().success());
    stop.store(true, Ordering::SeqCst);
    assert!(purger.join().unwrap() > 5, "the purge loop ran");
    assert!(answered.repeats.load(Ordering::SeqCst) > 100);
    settled_usage_matches(&store, &answered, calls.load(Ordering::SeqCst)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_killed_after_its_flush_loses_and_doubles_nothing() {
    let (up, calls) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = config(dir.path(), &store, &up);
    let answered = Answered::default();
    for _ in 0..3 {
        let gw = Gateway::start(&["--config", &cfg], &[]);
        traffic(&[gw.url("/v1/x")], 6, 4, &answered).await;
        answered.all_ok(&[&gw]);
        // Past the tally's flush (every 200 ms), then SIGKILL: nothing is drained.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let status = std::process::Command::new("kill")
            .args(["-KILL", &gw.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        drop(gw);
        let out = run(&["ledger", "purge", "--expired", "--store", &store]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    settled_usage_matches(&store, &answered, calls.load(Ordering::SeqCst)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateways_on_one_postgresql_purging_while_they_answer_count_everything_once() {
    let base = oncely_store_conformance::testing::shared_pg_url();
    let store = oncely_store_conformance::testing::fresh_pg_schema(&base).await;
    let (up, calls) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &store, &up);
    let out = run(&["migrate", "--store", &store]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (a, b) = (
        Gateway::start(&["--config", &cfg], &[]),
        Gateway::start(&["--config", &cfg], &[]),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let purgers = [
        purging(store.clone(), stop.clone()),
        purging(store.clone(), stop.clone()),
    ];
    let answered = Answered::default();
    traffic(&[a.url("/v1/x"), b.url("/v1/x")], 8, 14, &answered).await;
    answered.all_ok(&[&a, &b]);
    assert!(a.terminate().success());
    assert!(b.terminate().success());
    stop.store(true, Ordering::SeqCst);
    for p in purgers {
        assert!(p.join().unwrap() > 5, "the purge loop ran");
    }
    settled_usage_matches(&store, &answered, calls.load(Ordering::SeqCst)).await;
}

/// Copies what the gateway wrote into `new` (the current schema) into a new SQLite file
/// `old` of schema `version` (`MIGRATIONS[..version]` as those releases shipped them),
/// as that release would have held it; `extra` runs after the copy.
fn as_an_older_release(new: &Path, old: &Path, version: u32, extra: &str) {
    use oncely_store::sqlite::MIGRATIONS;
    let conn = rusqlite::Connection::open(old).unwrap();
    for m in &MIGRATIONS[..version as usize] {
        conn.execute_batch(m.sql).unwrap();
    }
    let columns = "id, scope, key, fingerprint, class, route, principal, state, owner, \
         attempt, lease_until, created_at, updated_at, completed_at, expires_at, status, \
         headers, body, units, repeats, repeat_units, workflow_id, provider_request_id, \
         last_error";
    conn.execute("ATTACH ?1 AS new", [new.display().to_string()])
        .unwrap();
    conn.execute_batch(&format!(
        "INSERT INTO records ({columns}) SELECT {columns} FROM new.records; \
         INSERT INTO repeat_events (record_id, principal, route, at, kind, units, expires_at) \
         SELECT record_id, principal, route, at, kind, units, expires_at \
         FROM new.repeat_events; \
         DETACH new; {extra} PRAGMA user_version = {version};"
    ))
    .unwrap();
}

/// A SQLite ledger of an older schema (version 4: no usage history, repeat events
/// without `count`, and repeats an older release counted on the record alone; the
/// records table as it was before schema 6) is upgraded by `oncely migrate`, and every
/// record and all usage it held are kept, before and after the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_ledger_of_the_previous_schema_and_keeps_its_usage() {
    let (up, calls) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("written.db");
    let cfg = config(dir.path(), &format!("sqlite://{}", written.display()), &up);
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let headers = [AUTH[0], ("idempotency-key", "old-1")];
    for _ in 0..3 {
        let a = http_post(&gw.url("/v1/x"), "job-1", &headers).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    assert!(gw.terminate().success());
    let db = dir.path().join("ledger.db");
    let store = format!("sqlite://{}", db.display());
    // As the release of schema 4 left it, with 3 repeats more on the record alone.
    as_an_older_release(
        &written,
        &db,
        4,
        "UPDATE records SET repeats = repeats + 3, repeat_units = repeat_units + 15;",
    );
    let out = run(&["migrate", "--store", &store]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let version = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("PRAGMA user_version;")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        oncely_store::sqlite::SCHEMA_VERSION.to_string()
    );
    assert_eq!(
        usage(&store),
        (1, 5, 5, 25),
        "what the records held is kept"
    );
    // The record itself, as the gateway wrote it.
    let before = run(&[
        "ledger",
        "list",
        "--json",
        "--store",
        &format!("sqlite://{}", written.display()),
    ]);
    let after = run(&["ledger", "list", "--json", "--store", &store]);
    let records = |o: &std::process::Output| -> serde_json::Value {
        serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stderr(o)))
    };
    let mut expected = records(&before);
    // With the 3 repeats the older release counted on the record alone.
    expected[0]["repeats"] = 5.into();
    expected[0]["repeat_units"] = 25.into();
    assert_eq!(
        records(&after),
        expected,
        "the record reads as it was written"
    );
    assert_eq!(records(&after).as_array().unwrap().len(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let out = run(&["ledger", "purge", "--expired", "--store", &store]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(&["ledger", "list", "--json", "--store", &store]);
    assert_eq!(stdout(&out).trim(), "[]", "the record was purged");
    assert_eq!(usage(&store), (1, 5, 5, 25), "and its usage kept");
}
