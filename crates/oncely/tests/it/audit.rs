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
