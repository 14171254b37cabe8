//! Statements that explain a bill, through the real binary: `oncely usage --statement`
//! against a gateway's SQLite ledger after fresh calls, replays and joins of two
//! accounts, checked against `oncely usage --json` and `oncely ledger list --json`; and
//! `oncely audit --statements` checked against `oncely audit --json`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;

use crate::common::{post as http_post, run, stderr, stdout, Gateway};

/// Alice's key, and Bob's, whose markup must come out escaped.
const ALICE: &str = "Bearer sk_alice";
const BOB: &str = "Bearer sk_<bob>&co";

fn ok_stdout(args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok_stdout(args)).expect("one JSON document")
}

/// The rows of a Markdown statement's repeat table: (time, route, units, answer).
fn md_repeats(text: &str) -> Vec<(String, String, u64, String)> {
    text.lines()
        .filter(|l| l.starts_with("| 20"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 4, "{l}");
            (
                cells[0].to_owned(),
                cells[1].to_owned(),
                cells[2].parse().unwrap(),
                cells[3].to_owned(),
            )
        })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statement_lists_each_repeat_and_matches_usage_and_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    statement_matches_the_ledger(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statement_from_a_postgresql_ledger_matches_it_too() {
    let store = crate::cluster::fresh_schema(&crate::cluster::shared_url()).await;
    statement_matches_the_ledger(&store).await;
}

/// Runs a gateway on `store`, makes fresh calls, replays and joins for two accounts, and
/// checks their statements against `usage --json` and `ledger list --json`.
async fn statement_matches_the_ledger(store: &str) {
    let store = store.to_owned();
    let (up, calls) = crate::usage_history::render_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = "{store}"
upstream = "{up}"

[[routes]]
method = "POST"
path = "/v1/render"
class = "write"
key = "header-or-fingerprint"
principal = "header:authorization"
units = "json:/text"
window = "1h"
wait = "20s"
"#
        ),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", cfg.to_str().unwrap()], &[]);
    let url = gw.url("/v1/render");
    let send = |who: &'static str, body: &'static str| {
        let url = url.clone();
        async move {
            let a = http_post(
                &url,
                body,
                &[("authorization", who), ("content-type", "application/json")],
            )
            .await;
            assert_eq!(a.status, 200, "{}", a.text());
            a.header("oncely-status").to_owned()
        }
    };
    let mut seen: Vec<(&str, String)> = Vec::new();
    // Alice: one fast render (4 units) and two replays of it.
    for _ in 0..3 {
        seen.push((ALICE, send(ALICE, r#"{"text":"abcd"}"#).await));
    }
    // Alice: one slow render (8 units) and six callers that repeat it while it runs.
    let original = tokio::spawn(send(ALICE, r#"{"text":"slow one"}"#));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let joiners: Vec<_> = (0..6)
        .map(|_| tokio::spawn(send(ALICE, r#"{"text":"slow one"}"#)))
        .collect();
    seen.push((ALICE, original.await.unwrap()));
    for j in joiners {
        seen.push((ALICE, j.await.unwrap()));
    }
    // Bob: one render (2 units) and one replay.
    for _ in 0..2 {
        seen.push((BOB, send(BOB, r#"{"text":"xy"}"#).await));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3, "each render ran once");
    let count = |who: &str, status: &str| {
        seen.iter()
            .filter(|(w, s)| *w == who && s == status)
            .count() as u64
    };
    assert_eq!(count(ALICE, "fresh"), 2, "{seen:?}");
    assert_eq!(
        count(ALICE, "replayed") + count(ALICE, "joined"),
        8,
        "{seen:?}"
    );
    assert!(count(ALICE, "joined") >= 1, "some callers joined: {seen:?}");
    // The drain writes every repeat counted in memory.
    assert_eq!(gw.terminate().code(), Some(0));

    // What the ledger says.
    let usage = json(&["usage", "--json", "--store", &store]);
    let records = json(&["ledger", "list", "--json", "--store", &store]);
    let records = records.as_array().unwrap();
    let row = |hash: &str| {
        usage["by_principal"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["principal"] == hash)
            .unwrap_or_else(|| panic!("{hash} not in {usage}"))
            .clone()
    };
    let hash_of = |units: u64| {
        records.iter().find(|r| r["units"] == units).unwrap()["principal"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (alice_hash, bob_hash) = (hash_of(4), hash_of(2));
    let alice = row(&alice_hash);
    assert_eq!(
        (alice["fresh"].as_u64(), alice["fresh_units"].as_u64()),
        (Some(2), Some(12))
    );
    assert_eq!(
        (alice["repeats"].as_u64(), alice["repeat_units"].as_u64()),
        (Some(8), Some(2 * 4 + 6 * 8))
    );

    // Alice's statement, Markdown, by her raw key.
    let md = ok_stdout(&["usage", "--statement", ALICE, "--store", &store]);
    assert!(md.contains(&format!("- Account: {ALICE}")), "{md}");
    assert!(md.contains(&alice_hash), "{md}");
    assert_eq!(md_total(&md, "Charged: executed"), (2, 12));
    assert_eq!(
        md_total(&md, "Not charged"),
        (
            alice["repeats"].as_u64().unwrap(),
            alice["repeat_units"].as_u64().unwrap()
        )
    );
    let lines = md_repeats(&md);
    assert_eq!(lines.len(), 8, "{md}");
    let kind = |k: &str| lines.iter().filter(|l| l.3 == k).count() as u64;
    assert_eq!(kind("joined a running original"), count(ALICE, "joined"));
    assert_eq!(kind("replayed a finished one"), count(ALICE, "replayed"));
    for (at, route, _, _) in &lines {
        assert!(oncely_core::Timestamp::parse_rfc3339(at).is_ok(), "{at}");
        assert_eq!(route, records[0]["route"].as_str().unwrap());
    }
    // Two repeats of the fast render (4 units), six of the slow one (8 units). (A repeat
    // of the fast one may join it too, if it comes before the answer is recorded.)
    let units = |u: u64| lines.iter().filter(|l| l.2 == u).count();
    assert_eq!((units(4), units(8)), (2, 6), "{md}");
    let times: Vec<&String> = lines.iter().map(|l| &l.0).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "oldest first: {times:?}"
    );
    // The ledger's per-record counters agree with the lines.
    let ledger_repeats: u64 = records
        .iter()
        .filter(|r| r["principal"] == alice_hash.as_str())
        .map(|r| r["repeats"].as_u64().unwrap())
        .sum();
    assert_eq!(ledger_repeats, lines.len() as u64);
    // The same by hash, and within a period that holds everything.
    let by_hash = ok_stdout(&[
        "usage",
        "--statement",
        &alice_hash,
        "--since",
        "1h",
        "--store",
        &store,
    ]);
    assert_eq!(md_repeats(&by_hash), lines);
    assert!(by_hash.contains("the last 1h"), "{by_hash}");

    // Bob's statement, HTML: the figures, and his key escaped.
    let bob = row(&bob_hash);
    let html = ok_stdout(&[
        "usage",
        "--statement",
        BOB,
        "--format",
        "html",
        "--store",
        &store,
    ]);
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(html.contains("Bearer sk_&lt;bob&gt;&amp;co"), "{html}");
    assert!(!html.contains("<bob>"), "{html}");
    assert!(html.contains(&format!(
        "<td>Charged: executed</td><td class=\"n\">{}</td><td class=\"n\">{}</td>",
        bob["fresh"], bob["fresh_units"]
    )));
    assert!(html.contains(&format!(
        "<td>Not charged: repeats answered from the ledger</td><td class=\"n\">{}</td><td class=\"n\">{}</td>",
        bob["repeats"], bob["repeat_units"]
    )), "{html}");
    assert_eq!(
        html.matches("replayed a finished one").count() as u64,
        count(BOB, "replayed"),
        "{html}"
    );
    assert_eq!(
        html.matches("joined a running original").count() as u64,
        count(BOB, "joined")
    );
    assert_eq!(count(BOB, "replayed") + count(BOB, "joined"), 1);

    // An account with no calls gets an empty statement, and --format needs --statement.
    let none = ok_stdout(&["usage", "--statement", "Bearer nobody", "--store", &store]);
    assert_eq!(md_total(&none, "Charged: executed"), (0, 0));
    assert!(none.contains("None."), "{none}");
    let o = run(&["usage", "--format", "html", "--store", &store]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// acct_1: an original (90 s), a repeat during it, a repeat after it; acct_2: an
/// original and a repeat after; acct_3: no repeat.
const LOG: &str = r#"{"ts":"2026-11-06T10:00:00Z","principal":"acct_1","method":"POST","path":"/v1/render","body":{"text":"hello"},"units":5,"duration_ms":90000}
{"ts":"2026-11-06T10:00:30Z","principal":"acct_1","method":"POST","path":"/v1/render","body":{"text":"hello"},"units":5,"duration_ms":90000}
{"ts":"2026-11-06T10:06:30Z","principal":"acct_1","method":"POST","path":"/v1/render","body":{"text":"hello"},"units":5,"duration_ms":1000}
{"ts":"2026-11-06T10:07:00Z","principal":"acct/2","method":"POST","path":"/v1/voice?x=<1>","body":{"text":"hi"},"units":2,"duration_ms":1000}
{"ts":"2026-11-06T10:08:00Z","principal":"acct/2","method":"POST","path":"/v1/voice?x=<1>","body":{"text":"hi"},"units":2,"duration_ms":1000}
{"ts":"2026-11-06T10:09:00Z","principal":"acct_3","method":"POST","path":"/v1/render","body":{"text":"once"},"units":4,"duration_ms":1000}
"#;

#[test]
fn audit_statements_match_the_audit_per_principal() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    std::fs::write(&log, LOG).unwrap();
    let log = log.to_str().unwrap();
    let report = json(&["audit", log, "--json", "--price-per-unit", "0.5"]);
    let md_dir = dir.path().join("md");
    let html_dir = dir.path().join("html");
    // The report on stdout is unchanged by --statements.
    let with = json(&[
        "audit",
        log,
        "--json",
        "--price-per-unit",
        "0.5",
        "--statements",
        md_dir.to_str().unwrap(),
    ]);
    assert_eq!(with["by_principal"], report["by_principal"]);
    ok_stdout(&[
        "audit",
        log,
        "--price-per-unit",
        "0.5",
        "--statements",
        html_dir.to_str().unwrap(),
        "--statements-format",
        "html",
    ]);
    let by = report["by_principal"].as_array().unwrap();
    assert_eq!(by.len(), 3);
    assert_eq!(std::fs::read_dir(&md_dir).unwrap().count(), 3);
    assert_eq!(std::fs::read_dir(&html_dir).unwrap().count(), 3);
    for p in by {
        let name = p["principal"].as_str().unwrap();
        let file = |d: &std::path::Path, ext: &str| {
            std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|f| {
                    let text = std::fs::read_to_string(f).unwrap();
                    f.extension().unwrap() == ext
                        && (text.contains(&format!("- Account: {name}\n"))
                            || text.contains(&format!("<dt>Account</dt><dd>{name}</dd>")))
                })
                .unwrap_or_else(|| panic!("no statement for {name}"))
        };
        let md = std::fs::read_to_string(file(&md_dir, "md")).unwrap();
        assert_eq!(
            md_total(&md, "Charged: every request"),
            (
                p["requests"].as_u64().unwrap(),
                p["units"].as_u64().unwrap()
            ),
            "{md}"
        );
        assert_eq!(
            md_total(&md, "Of them, repeats"),
            (
                p["duplicate_requests"].as_u64().unwrap(),
                p["duplicate_units"].as_u64().unwrap()
            )
        );
        assert!(
            md.contains(&format!(
                "- Credit owed: {} ",
                p["credit"].as_f64().unwrap()
            )),
            "{md}\n{p}"
        );
        let lines = md_repeats(&md);
        assert_eq!(
            lines.len() as u64,
            p["duplicate_requests"].as_u64().unwrap()
        );
        let kind = |k: &str| lines.iter().filter(|l| l.3 == k).count() as u64;
        assert_eq!(
            kind("joined a running original"),
            p["during"].as_u64().unwrap()
        );
        assert_eq!(
            kind("replayed a finished one"),
            p["after"].as_u64().unwrap()
        );
        let html = std::fs::read_to_string(file(&html_dir, "html")).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(!html.contains("<1>"), "the path is escaped: {html}");
    }
    let acct1 = std::fs::read_to_string(md_dir.join("statement-acct_1.md")).unwrap();
    assert_eq!(
        md_repeats(&acct1)
            .iter()
            .map(|l| (l.0.as_str(), l.3.as_str()))
            .collect::<Vec<_>>(),
        [
            ("2026-11-06T10:00:30.000Z", "joined a running original"),
            ("2026-11-06T10:06:30.000Z", "replayed a finished one"),
        ]
    );
    assert!(
        acct1.contains("- Credit owed: 5 (10 units at 0.5 per unit)"),
        "{acct1}"
    );
    let html2 = std::fs::read_dir(&html_dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .find(|t| t.contains("acct/2"))
        .unwrap();
    assert!(html2.contains("POST /v1/voice?x=&lt;1&gt;"), "{html2}");
}
