//! What makes two requests identical: principal, method, path and canonical body.

use crate::{args, audit_lines, line, ts, DAY};
use oncely_audit::{FieldMap, RawAuditArgs};

fn pair(a: &str, b: &str) -> u64 {
    audit_lines(
        &[line(DAY, "p", a, 1, 0), line(DAY + 1_000, "p", b, 1, 0)],
        &args(),
    )
    .duplicate_requests
}

#[test]
fn json_bodies_are_compared_canonically() {
    assert_eq!(
        pair(
            r#"{"a":1.0,"b":[1,2],"c":{"x":"é"}}"#,
            r#"{ "c" : { "x" : "\u00e9" }, "b" : [ 1, 2e0 ], "a" : 1 }"#
        ),
        1
    );
    // A body logged as a string holding the same JSON is the same body.
    assert_eq!(pair(r#"{"a":1}"#, r#""{\"a\": 1.0}""#), 1);
    // Different values, array order, or types are different requests.
    assert_eq!(pair(r#"{"a":1}"#, r#"{"a":2}"#), 0);
    assert_eq!(pair(r#"{"b":[1,2]}"#, r#"{"b":[2,1]}"#), 0);
    assert_eq!(pair(r#"{"a":1}"#, r#"{"a":"1"}"#), 0);
    // Plain-text bodies compare byte for byte.
    assert_eq!(pair(r#""hello world""#, r#""hello world""#), 1);
    assert_eq!(pair(r#""hello world""#, r#""hello  world""#), 0);
}

#[test]
fn ignored_fields_are_left_out() {
    let a = r#"{"text":"hi","request_id":"r-1","meta":{"trace":"t1","plan":"pro"}}"#;
    let b = r#"{"text":"hi","request_id":"r-2","meta":{"trace":"t2","plan":"pro"}}"#;
    let lines = [line(DAY, "p", a, 1, 0), line(DAY + 1_000, "p", b, 1, 0)];
    assert_eq!(audit_lines(&lines, &args()).duplicate_requests, 0);
    let mut ignoring = args();
    ignoring.ignore_fields = vec!["/request_id".into(), "/meta/trace".into()];
    assert_eq!(audit_lines(&lines, &ignoring).duplicate_requests, 1);
    // Only the named pointers are ignored.
    let c = r#"{"text":"hi","request_id":"r-3","meta":{"trace":"t3","plan":"free"}}"#;
    let lines = [line(DAY, "p", a, 1, 0), line(DAY + 1_000, "p", c, 1, 0)];
    assert_eq!(audit_lines(&lines, &ignoring).duplicate_requests, 0);
}

#[test]
fn the_same_body_from_two_principals_is_not_a_repeat() {
    let body = r#"{"text":"the same words"}"#;
    let report = audit_lines(
        &[
            line(DAY, "acct_a", body, 100, 0),
            line(DAY + 1_000, "acct_b", body, 100, 0),
            line(DAY + 2_000, "acct_b", body, 100, 0),
        ],
        &args(),
    );
    assert_eq!(report.duplicate_requests, 1);
    assert_eq!(report.by_principal.len(), 2);
    let b = &report.by_principal[0];
    assert_eq!(
        (b.principal.as_str(), b.requests, b.duplicate_units),
        ("acct_b", 2, 100)
    );
    let a = &report.by_principal[1];
    assert_eq!(
        (a.principal.as_str(), a.requests, a.duplicate_units),
        ("acct_a", 1, 0)
    );
}

#[test]
fn method_and_path_with_query_are_part_of_the_identity() {
    let at = |ms: i64, method: &str, path: &str| {
        format!(
            r#"{{"ts":"{}","principal":"p","method":"{method}","path":"{path}","body":{{"x":1}}}}"#,
            ts(ms)
        )
    };
    let report = audit_lines(
        &[
            at(DAY, "POST", "/v1/render"),
            at(DAY + 1, "PUT", "/v1/render"),
            at(DAY + 2, "POST", "/v1/render?voice=2"),
            at(DAY + 3, "POST", "/v1/render"),
        ],
        &args(),
    );
    assert_eq!(report.duplicate_requests, 1);
    // No units in these lines: each request counts as one unit.
    assert_eq!(
        (report.units, report.duplicate_units, report.units_missing),
        (4, 1, 4)
    );
}

#[test]
fn body_sha256_identifies_bodies_in_logs_that_keep_no_body() {
    let h1 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let h2 = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752";
    let at = |ms: i64, h: &str| {
        format!(
            r#"{{"ts":"{}","principal":"p","method":"POST","path":"/x","body_sha256":"{h}","units":3}}"#,
            ts(ms)
        )
    };
    let report = audit_lines(&[at(DAY, h1), at(DAY + 5, h2), at(DAY + 9, h1)], &args());
    assert_eq!((report.duplicate_requests, report.duplicate_units), (1, 3));
}

#[test]
fn fields_named_otherwise_are_mapped() {
    // A log that calls everything differently, with the account nested and epoch seconds.
    let at = |secs: i64, text: &str| {
        format!(
            r#"{{"time":{secs},"auth":{{"account":"acct_9"}},"verb":"POST","url":"/v1/render","payload":{{"text":"{text}"}},"chars":{},"took_ms":90000}}"#,
            text.len()
        )
    };
    let s = DAY / 1000;
    let lines = [at(s, "one"), at(s + 200, "one"), at(s + 300, "three")];
    let raw = RawAuditArgs {
        files: vec!["-".into()],
        fields: [
            "ts=time",
            "principal=/auth/account",
            "method=verb",
            "path=url",
            "body=payload",
            "units=chars",
            "duration_ms=took_ms",
        ]
        .map(String::from)
        .to_vec(),
        ..RawAuditArgs::default()
    };
    let args = raw.resolve().unwrap();
    let report = audit_lines(&lines, &args);
    assert_eq!(report.unreadable_lines, 0);
    assert_eq!((report.requests, report.units), (3, 11));
    assert_eq!((report.duplicate_requests, report.duplicate_units), (1, 3));
    assert_eq!(report.after, 1);
    assert_eq!(report.delays.after.min_ms, Some(110_000));
    assert_eq!(report.by_principal[0].principal, "acct_9");

    // Without the mapping, every line is unreadable, and says why.
    let plain = audit_lines(&lines, &crate::args());
    assert_eq!((plain.requests, plain.unreadable_lines), (0, 3));
    assert_eq!(plain.unreadable_examples[0].reason, "missing field \"ts\"");
    assert_ne!(FieldMap::default(), args.fields);
}

#[test]
fn absurd_units_saturate_instead_of_crashing() {
    let body = r#"{"x":1}"#;
    let report = audit_lines(
        &[
            line(DAY, "p", body, u64::MAX, 0),
            line(DAY + 1, "p", body, u64::MAX, 0),
            line(DAY + 2, "q", body, u64::MAX, 0),
        ],
        &args(),
    );
    assert_eq!(report.units, u64::MAX);
    assert_eq!(report.duplicate_units, u64::MAX);
    assert_eq!(report.duplicate_requests, 1);
}
