//! The usage history through the real binary: usage outlives the records it counts.
//!
//! A route with a 3 s window; after its records expire and are purged, `oncely usage`
//! (per principal, `--json`), its hourly rows (`--by hour`, CSV and JSON), the admin
//! API's `GET /usage` and `GET /usage?by=hour` and the statement say what they said
//! before, on SQLite and on PostgreSQL. Then `usage_retention`: checked by `check-config`,
//! and history hours aged past it dropped by `oncely ledger purge --expired` and by the
//! server's own purge.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use oncely_core::Timestamp;
use serde_json::Value;

use crate::common::{get, post as http_post, run, stderr, stdout, upstream, Gateway};

const TOKEN: &str = "usage-history-s3cret";
const ALICE: &str = "Bearer sk_alice";
const BOB: &str = "Bearer sk_bob";
const CSV_HEADER: &str = "principal,route,hour,fresh,fresh_units,repeats,repeat_units";

fn ok_stdout(args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok_stdout(args)).expect("one JSON document")
}

/// An upstream whose `POST /v1/render` counts its executions and takes 1.5 s for a body
/// with "slow" in it.
pub(crate) async fn render_upstream() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let addr = upstream(axum::Router::new().route(
        "/v1/render",
        post(move |body: String| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if body.contains("slow") {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                format!("rendered {body}")
            }
        }),
    ))
    .await;
    (format!("http://{addr}"), calls)
}

/// A config on `store` with one guarded route of window `window`, units the characters
/// of `/text`, and `usage_retention = "1h"`.
fn config(dir: &std::path::Path, store: &str, upstream: &str, window: &str) -> String {
    let cfg = dir.join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = "{store}"
upstream = "{upstream}"
usage_retention = "1h"

[[routes]]
method = "POST"
path = "/v1/render"
class = "write"
key = "header-or-fingerprint"
principal = "header:authorization"
units = "json:/text"
window = "{window}"
wait = "20s"
"#
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_owned()
}

async fn send(gw: &Gateway, who: &str, body: &str) -> String {
    let a = http_post(
        &gw.url("/v1/render"),
        body,
        &[("authorization", who), ("content-type", "application/json")],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    a.header("oncely-status").to_owned()
}

async fn admin(gw: &Gateway, path: &str) -> Value {
    let auth = format!("Bearer {TOKEN}");
    let res = get(&gw.admin_url(path), &[("authorization", &auth)]).await;
    assert_eq!(res.status, 200, "{path}: {}", res.text());
    res.json()
}

/// Waits (up to 10 s) until the admin API counts `repeats` repeats: the gateway writes
/// the repeats it counted every 200 ms.
async fn wait_for_repeats(gw: &Gateway, repeats: u64) {
    for _ in 0..200 {
        if admin(gw, "/usage?since=30d").await["totals"]["repeats"] == repeats {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{repeats} repeats not counted: {}",
        admin(gw, "/usage?since=30d").await
    );
}

/// Purges with the CLI until the ledger holds no record (up to 20 s); answers how many
/// records the purges said they deleted.
async fn purge_until_empty(store: &str, config: Option<&str>) -> u64 {
    let mut purged = 0;
    for _ in 0..40 {
        let mut args = vec!["ledger", "purge", "--expired", "--store", store];
        if let Some(c) = config {
            args.extend(["--config", c]);
        }
        let out = ok_stdout(&args);
        // "purged N expired records and M usage history rows older than D"
        let n: u64 = out
            .strip_prefix("purged ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{out:?}"));
        purged += n;
        let left = json(&["ledger", "list", "--json", "--store", store]);
        if left.as_array().unwrap().is_empty() {
            return purged;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the records did not expire");
}

/// The rows of a statement's one-by-one table: (time, route, units, answer).
fn listed(md: &str) -> Vec<Vec<String>> {
    table_rows(md, 4)
}

/// The rows of a statement's per-hour table: (hour, route, repeats, units, answers).
fn summed(md: &str) -> Vec<Vec<String>> {
    table_rows(md, 5)
}

fn table_rows(md: &str, cells: usize) -> Vec<Vec<String>> {
    md.lines()
        .filter(|l| l.starts_with("| 20"))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .filter(|c| c.len() == cells)
        .collect()
}

/// The requests and units of a Markdown totals row starting with `label`.
fn md_total(text: &str, label: &str) -> (u64, u64) {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("| {label}")))
        .unwrap_or_else(|| panic!("no {label:?} row in:\n{text}"));
    let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
    (cells[1].parse().unwrap(), cells[2].parse().unwrap())
}

/// Everything usage says, by the CLI and the admin API, checked against each other.
#[derive(Debug, PartialEq)]
struct Seen {
    usage: Value,
    csv: String,
    rows: Value,
}

async fn seen(gw: &Gateway, store: &str) -> Seen {
    let usage = json(&["usage", "--since", "30d", "--json", "--store", store]);
    let all = json(&["usage", "--json", "--store", store]);
    assert_eq!(all, usage, "everything kept is within 30 days");
    assert_eq!(admin(gw, "/usage?since=30d").await, usage);
    assert_eq!(admin(gw, "/usage").await, usage, "the default is 30d");
    // A period longer than the clock has run is everything.
    let ages = "200000000000d";
    assert_eq!(
        json(&["usage", "--since", ages, "--json", "--store", store]),
        usage
    );
    assert_eq!(admin(gw, &format!("/usage?since={ages}")).await, usage);
    let auth = format!("Bearer {TOKEN}");
    let page = get(
        &gw.admin_url(&format!("/console/usage?since={ages}")),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(page.text().contains("<figure id=\"usage-chart\">"));
    let csv = ok_stdout(&["usage", "--by", "hour", "--store", store]);
    assert_eq!(
        ok_stdout(&[
            "usage", "--by", "hour", "--format", "csv", "--since", "30d", "--store", store
        ]),
        csv
    );
    let rows = json(&[
        "usage", "--by", "hour", "--format", "json", "--store", store,
    ]);
    assert_eq!(admin(gw, "/usage?by=hour").await, rows);
    assert_eq!(admin(gw, "/usage?by=hour&since=2h").await, rows);
    // The CSV says what the JSON says, with exactly the contract's header.
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(CSV_HEADER), "{csv}");
    let from_csv: Vec<Value> = lines
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            assert_eq!(c.len(), 7, "{l}");
            let n = |i: usize| c[i].parse::<u64>().unwrap();
            serde_json::json!({"principal": c[0], "route": c[1], "hour": c[2], "fresh": n(3),
                "fresh_units": n(4), "repeats": n(5), "repeat_units": n(6)})
        })
        .collect();
    assert_eq!(Value::Array(from_csv), rows);
    // Each row: the contract's members, an hour that starts an hour (RFC 3339, UTC, no
    // fractional seconds) within the last two; the rows add up to the usage.
    let now = Timestamp(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64,
    );
    let mut sums: std::collections::BTreeMap<String, [u64; 4]> = Default::default();
    for r in rows.as_array().unwrap() {
        let mut keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "fresh",
                "fresh_units",
                "hour",
                "principal",
                "repeat_units",
                "repeats",
                "route"
            ]
        );
        let hour = r["hour"].as_str().unwrap();
        assert!(
            hour.len() == 20 && hour.ends_with(":00:00Z"),
            "{hour:?} is not the start of an hour without fractional seconds"
        );
        let t = Timestamp::parse_rfc3339(hour).unwrap();
        assert!(
            t <= now && t.0 > now.0 - 2 * 3_600_000,
            "{hour} is not a recent hour"
        );
        assert_eq!(r["route"], "POST /v1/render");
        let s = sums
            .entry(r["principal"].as_str().unwrap().to_owned())
            .or_default();
        for (i, k) in ["fresh", "fresh_units", "repeats", "repeat_units"]
            .iter()
            .enumerate()
        {
            s[i] += r[k].as_u64().unwrap();
        }
    }
    for p in usage["by_principal"].as_array().unwrap() {
        let s = sums[p["principal"].as_str().unwrap()];
        assert_eq!(
            [
                p["fresh"].as_u64().unwrap(),
                p["fresh_units"].as_u64().unwrap(),
                p["repeats"].as_u64().unwrap(),
                p["repeat_units"].as_u64().unwrap()
            ],
            s,
            "{p}"
        );
    }
    assert_eq!(sums.len(), usage["by_principal"].as_array().unwrap().len());
    Seen { usage, csv, rows }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_rows_and_statements_outlive_the_records_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    usage_outlives_the_records(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_rows_and_statements_outlive_the_records_on_postgresql() {
    let url = tokio::task::spawn_blocking(crate::cluster::shared_url)
        .await
        .unwrap();
    let store = crate::cluster::fresh_schema(&url).await;
    usage_outlives_the_records(&store).await;
}

/// Alice: a slow render (8 units) repeated twice (one repeat while it runs, one after);
/// Bob: a render (2 units), no repeat. Everything usage says before the records expire
/// and after they are purged is the same; the statement lists Alice's repeats one by one
/// before, and summed per hour after, with the same totals.
async fn usage_outlives_the_records(store: &str) {
    let (up, calls) = render_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), store, &up, "3s");
    let gw = Gateway::start(&["--config", &cfg], &[("ONCELY_ADMIN_TOKEN", TOKEN)]);

    let original = {
        let url = gw.url("/v1/render");
        tokio::spawn(async move {
            let a = http_post(
                &url,
                r#"{"text":"slow one"}"#,
                &[
                    ("authorization", ALICE),
                    ("content-type", "application/json"),
                ],
            )
            .await;
            assert_eq!(a.status, 200, "{}", a.text());
            a.header("oncely-status").to_owned()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut statuses = vec![send(&gw, ALICE, r#"{"text":"slow one"}"#).await];
    statuses.push(original.await.unwrap());
    statuses.push(send(&gw, ALICE, r#"{"text":"slow one"}"#).await);
    assert_eq!(send(&gw, BOB, r#"{"text":"xy"}"#).await, "fresh");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each render ran once");
    let count = |s: &str| statuses.iter().filter(|x| *x == s).count() as u64;
    assert_eq!(count("fresh"), 1, "{statuses:?}");
    let (joined, replayed) = (count("joined"), count("replayed"));
    assert_eq!(joined + replayed, 2, "{statuses:?}");
    wait_for_repeats(&gw, 2).await;

    // Before: the records are in the ledger.
    let before = seen(&gw, store).await;
    let records = json(&["ledger", "list", "--json", "--store", store]);
    let hash_of = |units: u64| {
        records
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["units"] == units)
            .unwrap()["principal"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (alice, bob) = (hash_of(8), hash_of(2));
    let row = |u: &Value, hash: &str| {
        u["by_principal"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["principal"] == hash)
            .unwrap_or_else(|| panic!("{hash} not in {u}"))
            .clone()
    };
    assert_eq!(
        row(&before.usage, &alice),
        serde_json::json!({"principal": alice, "fresh": 1, "fresh_units": 8, "repeats": 2, "repeat_units": 16})
    );
    assert_eq!(
        row(&before.usage, &bob),
        serde_json::json!({"principal": bob, "fresh": 1, "fresh_units": 2, "repeats": 0, "repeat_units": 0})
    );
    assert_eq!(
        before.usage["totals"],
        serde_json::json!({"fresh": 2, "fresh_units": 10, "repeats": 2, "repeat_units": 16})
    );
    let statement = |format: &str| {
        ok_stdout(&[
            "usage",
            "--statement",
            ALICE,
            "--since",
            "1d",
            "--format",
            format,
            "--store",
            store,
        ])
    };
    let md = statement("md");
    assert_eq!(md_total(&md, "Charged: executed"), (1, 8), "{md}");
    assert_eq!(md_total(&md, "Not charged"), (2, 16), "{md}");
    let lines = listed(&md);
    assert_eq!(lines.len(), 2, "{md}");
    assert!(lines
        .iter()
        .all(|l| l[1] == "POST /v1/render" && l[2] == "8"));
    let said = |l: &[Vec<String>], what: &str| l.iter().filter(|c| c[3] == what).count() as u64;
    assert_eq!(said(&lines, "joined a running original"), joined, "{md}");
    assert_eq!(said(&lines, "replayed a finished one"), replayed, "{md}");
    assert!(summed(&md).is_empty(), "{md}");
    assert!(!md.contains("Earlier repeats"), "{md}");
    assert!(md.contains("the start of its first hour"), "{md}");

    // The window ends; the CLI purges (usage_retention 1h keeps this hour).
    let purged = purge_until_empty(store, Some(&cfg)).await;
    assert_eq!(purged, 2, "Alice's record and Bob's");
    let out = ok_stdout(&["ledger", "purge", "--expired", "--config", &cfg]);
    assert_eq!(
        out.trim(),
        "purged 0 expired records and 0 usage history rows older than 1h"
    );

    // After: the same, from the usage history alone.
    let after = seen(&gw, store).await;
    assert_eq!(after, before);
    assert!(json(&["ledger", "list", "--json", "--store", store])
        .as_array()
        .unwrap()
        .is_empty());
    let md = statement("md");
    assert_eq!(md_total(&md, "Charged: executed"), (1, 8), "{md}");
    assert_eq!(md_total(&md, "Not charged"), (2, 16), "{md}");
    assert!(
        listed(&md).is_empty(),
        "no record left to list one by one: {md}"
    );
    assert!(
        md.contains("### Earlier repeats not charged, per hour"),
        "{md}"
    );
    assert!(md.contains("summed per hour"), "{md}");
    let hours = summed(&md);
    assert!(!hours.is_empty() && hours.len() <= 2, "{md}");
    let total = |i: usize| {
        hours
            .iter()
            .map(|h| h[i].parse::<u64>().unwrap())
            .sum::<u64>()
    };
    assert_eq!((total(2), total(3)), (2, 16), "{md}");
    for h in &hours {
        assert_eq!(h[1], "POST /v1/render");
        // `2026-12-01 18:00–19:00`, and how they were answered, in words.
        assert!(h[0].chars().count() == 22 && h[0].contains(":00–"), "{h:?}");
        assert!(
            h[4].contains("joined a running original") || h[4].contains("replayed a finished one"),
            "{h:?}"
        );
    }
    let answered = |what: &str| -> u64 {
        hours
            .iter()
            .flat_map(|h| h[4].split(", ").map(str::to_owned).collect::<Vec<_>>())
            .filter_map(|part| {
                part.strip_suffix(what)
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .sum()
    };
    assert_eq!(answered("joined a running original"), joined, "{md}");
    assert_eq!(answered("replayed a finished one"), replayed, "{md}");
    let html = statement("html");
    assert!(html.contains("<table class=\"older\">"), "{html}");
    assert!(html.contains(
        "<tr><td>Not charged: repeats answered from the ledger</td><td class=\"n\">2</td><td class=\"n\">16</td></tr>"
    ), "{html}");
    assert_eq!(gw.terminate().code(), Some(0));
}

#[test]
fn check_config_takes_usage_retention_as_a_duration_of_an_hour_or_more() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("oncely.toml");
    let check = |value: &str| {
        std::fs::write(
            &file,
            format!("upstream = \"http://127.0.0.1:3000\"\nusage_retention = {value}\n"),
        )
        .unwrap();
        run(&["check-config", file.to_str().unwrap()])
    };
    for ok in ["\"400d\"", "\"1h\"", "\"90m\""] {
        let o = check(ok);
        assert_eq!(o.status.code(), Some(0), "{ok}: {}", stderr(&o));
    }
    for (bad, reason) in [
        ("\"x\"", "usage_retention: duration \"x\""),
        ("\"30m\"", "usage_retention: must be at least 1h"),
        ("\"0s\"", "usage_retention: must be at least 1h"),
        ("400", "usage_retention: "),
    ] {
        let o = check(bad);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.starts_with(reason), "{bad}: {err:?}");
    }
}

/// Moves every hour of the SQLite usage history `hours` hours back.
fn age_history(db: &std::path::Path, hours: i64) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let n = conn
        .execute(
            "UPDATE usage_hours SET hour = hour - ?1",
            [hours * 3_600_000],
        )
        .unwrap();
    assert!(n > 0, "no history to age");
}

/// Bob's render and its repeat.
async fn render_and_repeat(gw: &Gateway) {
    assert_eq!(send(gw, BOB, r#"{"text":"xy"}"#).await, "fresh");
    assert_eq!(send(gw, BOB, r#"{"text":"xy"}"#).await, "replayed");
}

/// Usage of the period, as `usage --json` says it.
fn totals(store: &str) -> Value {
    json(&["usage", "--json", "--store", store])["totals"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn history_hours_past_usage_retention_are_dropped_by_the_cli_and_the_server() {
    let (up, _) = render_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let store = format!("sqlite://{}", db.display());
    let cfg = config(dir.path(), &store, &up, "1s");
    let zero = serde_json::json!({"fresh": 0, "fresh_units": 0, "repeats": 0, "repeat_units": 0});
    let one = serde_json::json!({"fresh": 1, "fresh_units": 2, "repeats": 1, "repeat_units": 2});

    // A render and its repeat; their record expires and is purged into the history.
    let gw = Gateway::start(&["--config", &cfg], &[("ONCELY_ADMIN_TOKEN", TOKEN)]);
    render_and_repeat(&gw).await;
    assert_eq!(
        gw.terminate().code(),
        Some(0),
        "the drain writes the repeat"
    );
    assert_eq!(purge_until_empty(&store, None).await, 1);
    assert_eq!(totals(&store), one);

    // Two hours old: kept by the default retention (400d), dropped by the config's (1h).
    age_history(&db, 2);
    assert_eq!(totals(&store), one, "still in the history");
    assert_eq!(
        json(&["usage", "--since", "1h", "--json", "--store", &store])["totals"],
        zero,
        "but out of the last hour"
    );
    assert_eq!(
        ok_stdout(&["ledger", "purge", "--expired", "--store", &store]).trim(),
        "purged 0 expired records and 0 usage history rows older than 400d"
    );
    assert_eq!(totals(&store), one);
    assert_eq!(
        ok_stdout(&["ledger", "purge", "--expired", "--config", &cfg]).trim(),
        "purged 0 expired records and 1 usage history row older than 1h"
    );
    assert_eq!(totals(&store), zero);

    // Again, and this time the server's own purge (it runs at start, then every minute)
    // drops the aged hour.
    let gw = Gateway::start(&["--config", &cfg], &[("ONCELY_ADMIN_TOKEN", TOKEN)]);
    render_and_repeat(&gw).await;
    assert_eq!(gw.terminate().code(), Some(0));
    assert_eq!(purge_until_empty(&store, None).await, 1);
    age_history(&db, 2);
    assert_eq!(totals(&store), one);
    let gw = Gateway::start(
        &["--config", &cfg, "--log-format", "json"],
        &[("ONCELY_ADMIN_TOKEN", TOKEN)],
    );
    for _ in 0..100 {
        if admin(&gw, "/usage?since=30d").await["totals"] == zero {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(admin(&gw, "/usage?since=30d").await["totals"], zero);
    let logged = gw.lines.lock().unwrap().iter().any(|l| {
        serde_json::from_str::<Value>(l)
            .is_ok_and(|v| v["message"] == "purged expired records" && v["history_rows"] == 1)
    });
    assert!(logged, "{:?}", gw.lines.lock().unwrap());
    assert_eq!(totals(&store), zero);
}
