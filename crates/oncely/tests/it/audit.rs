//! `oncely audit` through the real binary: arguments, standard input, gzip, JSON shape,
//! the credits file and exit codes. The detection itself is tested in `oncely-audit`.

use std::io::Write;
use std::process::Stdio;

use serde_json::Value;

use crate::common::{assert_usage_error, oncely, run, stdout};

/// Two accounts; acct_1 repeats one render 5 minutes after it finished (key order and
/// white space differ), acct_2 sends the same body once.
const LOG: &str = r#"{"ts":"2026-11-06T10:00:00Z","principal":"acct_1","method":"POST","path":"/v1/render","body":{"text":"hello world","voice":"a"},"units":11,"duration_ms":90000}
{"ts":"2026-11-06T10:00:30Z","principal":"acct_1","method":"POST","path":"/v1/render","body":{"text":"another one","voice":"a"},"units":11,"duration_ms":1000}
{"ts":"2026-11-06T10:06:30Z","principal":"acct_1","method":"POST","path":"/v1/render","body":{ "voice" : "a", "text" : "hello world" },"units":11,"duration_ms":90000}
{"ts":"2026-11-06T10:07:00Z","principal":"acct_2","method":"POST","path":"/v1/render","body":{"voice":"a","text":"hello world"},"units":11,"duration_ms":90000}
this line is not JSON
"#;

/// A retry loop that makes up an Idempotency-Key per attempt: acct_loop sends one render
/// under three keys (the second and third attempts are churned; the key under three of
/// the spellings read), then another render once. acct_good retries a charge under the
/// same key (a repeat, not churned); acct_none sends a body twice without a key.
const KEYED_LOG: &str = r#"{"ts":"2026-11-06T10:00:00Z","principal":"acct_loop","method":"POST","path":"/v1/render","body":{"text":"retry me"},"units":10,"duration_ms":1000,"idempotency_key":"k-1"}
{"ts":"2026-11-06T10:00:00Z","principal":"acct_good","method":"POST","path":"/v1/charge","body":{"amount":5},"units":10,"duration_ms":1000,"Idempotency-Key":"same"}
{"ts":"2026-11-06T10:00:00Z","principal":"acct_none","method":"POST","path":"/v1/render","body":{"text":"retry me"},"units":10,"duration_ms":1000}
{"ts":"2026-11-06T10:01:00Z","principal":"acct_loop","method":"POST","path":"/v1/render","body":{ "text" : "retry me" },"units":10,"duration_ms":1000,"idempotencyKey":"k-2"}
{"ts":"2026-11-06T10:01:30Z","principal":"acct_good","method":"POST","path":"/v1/charge","body":{"amount":5},"units":10,"duration_ms":1000,"Idempotency-Key":"same"}
{"ts":"2026-11-06T10:02:00Z","principal":"acct_loop","method":"POST","path":"/v1/render","body":{"text":"retry me"},"units":10,"duration_ms":1000,"Idempotency-Key":"k-3"}
{"ts":"2026-11-06T10:02:30Z","principal":"acct_none","method":"POST","path":"/v1/render","body":{"text":"retry me"},"units":10,"duration_ms":1000}
{"ts":"2026-11-06T10:03:00Z","principal":"acct_loop","method":"POST","path":"/v1/render","body":{"text":"another"},"units":10,"duration_ms":1000,"idempotency_key":"k-9"}
"#;

fn json_of(o: &std::process::Output) -> Value {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(&stdout(o)).expect("one JSON document on stdout")
}

#[test]
fn json_report_has_the_contract_shape_and_figures() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    std::fs::write(&log, LOG).unwrap();
    let csv = dir.path().join("credits.csv");
    let o = run(&[
        "audit",
        log.to_str().unwrap(),
        "--json",
        "--price-per-unit",
        "0.5",
        "--credits-csv",
        csv.to_str().unwrap(),
    ]);
    let r = json_of(&o);
    assert_eq!(r["requests"], 4);
    assert_eq!(r["units"], 44);
    assert_eq!(r["duplicate_requests"], 1);
    assert_eq!(r["duplicate_units"], 11);
    assert_eq!(r["during"], 0);
    assert_eq!(r["after"], 1);
    assert_eq!(r["unreadable_lines"], 1);
    // No line carries an Idempotency-Key: nothing can be churned.
    assert_eq!(r["churned"], 0);
    assert_eq!(r["keyed_requests"], 0);
    let by = r["by_principal"].as_array().unwrap();
    let acct1 = by.iter().find(|p| p["principal"] == "acct_1").unwrap();
    assert_eq!(acct1["requests"], 3);
    assert_eq!(acct1["units"], 33);
    assert_eq!(acct1["duplicate_requests"], 1);
    assert_eq!(acct1["duplicate_units"], 11);
    assert_eq!(acct1["credit"].as_f64(), Some(5.5));
    let acct2 = by.iter().find(|p| p["principal"] == "acct_2").unwrap();
    assert_eq!(acct2["duplicate_requests"], 0);
    let credits = std::fs::read_to_string(&csv).unwrap();
    assert!(credits.contains("acct_1"), "{credits}");
    assert!(
        !credits.contains("acct_2"),
        "nothing to credit acct_2: {credits}"
    );
}

#[test]
fn repeats_under_keys_made_up_per_attempt_are_churned() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    std::fs::write(&log, KEYED_LOG).unwrap();
    let log = log.to_str().unwrap();

    let r = json_of(&run(&["audit", log, "--json"]));
    assert_eq!(r["requests"], 8);
    // Every repeat counts whatever its key: the same-key retry and the keyless one too.
    assert_eq!(r["duplicate_requests"], 4);
    assert_eq!(r["duplicate_units"], 40);
    assert_eq!(r["churned"], 2);
    assert_eq!(r["keyed_requests"], 6);
    let by = r["by_principal"].as_array().unwrap();
    let of = |name: &str| {
        let p = by.iter().find(|p| p["principal"] == name).unwrap();
        (p["duplicate_requests"].clone(), p["churned"].clone())
    };
    assert_eq!(of("acct_loop"), (2.into(), 2.into()));
    assert_eq!(of("acct_good"), (1.into(), 0.into()));
    assert_eq!(of("acct_none"), (1.into(), 0.into()));
    let top = r["top_repeats"].as_array().unwrap();
    let looped = top.iter().find(|t| t["principal"] == "acct_loop").unwrap();
    assert_eq!(
        (&looped["repeats"], &looped["churned"]),
        (&2.into(), &2.into())
    );

    let o = run(&["audit", log]);
    assert_eq!(o.status.code(), Some(0));
    let text = stdout(&o);
    assert!(
        text.lines().any(|l| l
            == "2 requests repeated an earlier one under a new key: a retry loop that makes up \
                a key per attempt; oncely's churn_window joins them to the original when its \
                caller never got its answer"),
        "{text}"
    );
    // The log of the other tests keeps no keys: the report says nothing of churn.
    std::fs::write(dir.path().join("plain.jsonl"), LOG).unwrap();
    let plain = stdout(&run(&[
        "audit",
        dir.path().join("plain.jsonl").to_str().unwrap(),
    ]));
    assert!(!plain.contains("under a new key"), "{plain}");
}

#[test]
fn reads_gzip_from_standard_input_with_mapped_fields() {
    // The same log with other field names, gzip-compressed, on standard input.
    let renamed = LOG
        .replace("\"principal\"", "\"account\"")
        .replace("\"ts\"", "\"time\"");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(renamed.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    let mut child = oncely()
        .args([
            "audit",
            "-",
            "--json",
            "--field",
            "principal=account",
            "--field",
            "ts=time",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&gz).unwrap();
    let o = child.wait_with_output().unwrap();
    let r = json_of(&o);
    assert_eq!(r["requests"], 4);
    assert_eq!(r["duplicate_units"], 11);
}

#[test]
fn a_short_window_finds_no_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    std::fs::write(&log, LOG).unwrap();
    // The copy started 5 minutes after the original finished: outside a 1 minute window.
    let r = json_of(&run(&[
        "audit",
        log.to_str().unwrap(),
        "--json",
        "--window",
        "1m",
    ]));
    assert_eq!(r["duplicate_requests"], 0);
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    assert_usage_error(
        &run(&["audit", "/nonexistent/requests.jsonl"]),
        "nonexistent",
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    std::fs::write(&log, LOG).unwrap();
    let log = log.to_str().unwrap();
    assert_usage_error(&run(&["audit", log, "--window", "5x"]), "--window");
    assert_usage_error(&run(&["audit", log, "--field", "nonsense"]), "field");
    assert_usage_error(&run(&["audit", log, "--price-per-unit", "cheap"]), "price");
}
