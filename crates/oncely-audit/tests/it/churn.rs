//! Repeats under an Idempotency-Key made up anew (`churned`): a retry loop that makes up a
//! key per attempt repeats the request under another key each time.

use oncely_audit::{FieldMap, Report};

use crate::{args, audit_lines, line, DAY};

/// A line of `principal` with `body`, `secs` after the day's start, and `key` as the
/// member `member` (none when `key` is empty).
fn keyed(secs: i64, principal: &str, body: &str, member: &str, key: &str) -> String {
    let plain = line(DAY + secs * 1_000, principal, body, 10, 1_000);
    if key.is_empty() {
        return plain;
    }
    let plain = plain.strip_suffix('}').unwrap();
    format!(r#"{plain},"{member}":"{key}"}}"#)
}

/// One principal sends a render under three keys (two churned), another retries a charge
/// under its key (a repeat, not churned), a third sends keyless repeats.
fn log() -> Vec<String> {
    let render = r#"{"text":"retry me"}"#;
    let charge = r#"{"amount":5}"#;
    let quiet = r#"{"n":1}"#;
    vec![
        keyed(0, "acct_loop", render, "idempotency_key", "k-1"),
        keyed(0, "acct_good", charge, "Idempotency-Key", "same"),
        keyed(0, "acct_none", quiet, "idempotency_key", ""),
        keyed(60, "acct_loop", render, "idempotencyKey", "k-2"),
        keyed(90, "acct_good", charge, "Idempotency-Key", "same"),
        keyed(120, "acct_loop", render, "idempotency-key", "k-3"),
        keyed(150, "acct_none", quiet, "idempotency_key", ""),
        keyed(
            180,
            "acct_loop",
            r#"{"text":"new"}"#,
            "idempotency_key",
            "k-9",
        ),
    ]
}

fn by<'r>(report: &'r Report, principal: &str) -> &'r oncely_audit::PrincipalTotals {
    report
        .by_principal
        .iter()
        .find(|p| p.principal == principal)
        .unwrap()
}

#[test]
fn repeats_under_new_keys_are_churned_and_counted_per_principal() {
    let report = audit_lines(&log(), &args());
    assert_eq!(report.requests, 8);
    // Every repeat is a repeat whatever its key: the figures before churn are unchanged.
    assert_eq!(report.duplicate_requests, 4);
    assert_eq!(report.churned, 2);
    assert_eq!(report.keyed_requests, 6);
    assert_eq!(
        (
            by(&report, "acct_loop").duplicate_requests,
            by(&report, "acct_loop").churned
        ),
        (2, 2)
    );
    assert_eq!(
        (
            by(&report, "acct_good").duplicate_requests,
            by(&report, "acct_good").churned
        ),
        (1, 0)
    );
    assert_eq!(
        (
            by(&report, "acct_none").duplicate_requests,
            by(&report, "acct_none").churned
        ),
        (1, 0)
    );
    let top = report
        .top_repeats
        .iter()
        .find(|t| t.principal == "acct_loop")
        .unwrap();
    assert_eq!((top.repeats, top.churned), (2, 2));

    let json: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
    assert_eq!(json["churned"], 2);
    assert_eq!(json["keyed_requests"], 6);
    assert_eq!(json["by_principal"][0]["churned"], 2);

    let mut text = Vec::new();
    report.write_human(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains(
            "\n2 requests repeated an earlier one under a new key: a retry loop that makes up \
             a key per attempt; oncely's churn_window joins them to the original when its \
             caller never got its answer\n"
        ),
        "{text}"
    );
}

#[test]
fn without_keys_nothing_is_churned_and_the_report_does_not_say_so() {
    let body = r#"{"text":"retry me"}"#;
    let lines: Vec<String> = (0..3)
        .map(|i| line(DAY + i * 1_000, "p", body, 1, 0))
        .collect();
    let report = audit_lines(&lines, &args());
    assert_eq!(report.duplicate_requests, 2);
    assert_eq!((report.churned, report.keyed_requests), (0, 0));
    let mut text = Vec::new();
    report.write_human(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(!text.contains("under a new key"), "{text}");
}

#[test]
fn one_churned_repeat_reads_in_the_singular_and_none_is_said_when_keys_are_kept() {
    let body = r#"{"text":"retry me"}"#;
    let human = |keys: [&str; 2]| {
        let lines = [
            keyed(0, "p", body, "idempotency_key", keys[0]),
            keyed(60, "p", body, "idempotency_key", keys[1]),
        ];
        let mut text = Vec::new();
        audit_lines(&lines, &args()).write_human(&mut text).unwrap();
        String::from_utf8(text).unwrap()
    };
    let one = human(["a", "b"]);
    assert!(
        one.contains("\n1 request repeated an earlier one under a new key: ")
            && one.contains("joins it to the original"),
        "{one}"
    );
    let none = human(["a", "a"]);
    assert!(
        none.contains("\n0 requests repeated an earlier one under a new key: "),
        "{none}"
    );
}

#[test]
fn a_key_kept_elsewhere_in_the_line_is_mapped() {
    let body = r#"{"text":"retry me"}"#;
    let lines: Vec<String> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let plain = line(DAY + i as i64 * 1_000, "p", body, 1, 0);
            let plain = plain.strip_suffix('}').unwrap();
            format!(r#"{plain},"headers":{{"Idempotency-Key":"{key}"}}}}"#)
        })
        .collect();
    assert_eq!(
        audit_lines(&lines, &args()).churned,
        0,
        "not a top-level member"
    );
    let mut mapped = args();
    mapped.fields = FieldMap::parse(&["idempotency_key=/headers/Idempotency-Key"]).unwrap();
    let report = audit_lines(&lines, &mapped);
    assert_eq!((report.churned, report.keyed_requests), (2, 3));
}

#[test]
fn the_key_is_read_under_its_spellings_and_anything_else_is_no_key() {
    let body = r#"{"text":"retry me"}"#;
    let with = |secs: i64, extra: &str| {
        let plain = line(DAY + secs * 1_000, "p", body, 1, 0);
        format!("{},{extra}}}", plain.strip_suffix('}').unwrap())
    };
    // One key under every spelling, escaped once, and as a number and its digits: retries
    // under the same key, none churned.
    let same = [
        with(0, r#""idempotency_key":"k-1""#),
        with(1, r#""Idempotency-Key":"k-1""#),
        with(2, r#""idempotency-key":"k-1""#),
        with(3, r#""idempotencyKey":"k\u002d1""#),
        with(4, r#""idempotency_key":"k-2""#),
    ];
    let report = audit_lines(&same, &args());
    assert_eq!((report.keyed_requests, report.churned), (5, 1));
    let numbers = [
        with(0, r#""idempotency_key":42"#),
        with(1, r#""idempotency_key":"42""#),
    ];
    let report = audit_lines(&numbers, &args());
    assert_eq!((report.keyed_requests, report.churned), (2, 0));
    // Not a key, and never an unreadable line: the figures are those of a log without.
    let nothing: Vec<String> = ["null", r#""""#, "true", r#"{"k":"a"}"#, "[1]"]
        .iter()
        .enumerate()
        .map(|(i, v)| with(i as i64, &format!(r#""idempotency_key":{v}"#)))
        .collect();
    let report = audit_lines(&nothing, &args());
    assert_eq!((report.requests, report.unreadable_lines), (5, 0));
    assert_eq!((report.duplicate_requests, report.keyed_requests), (4, 0));
    // Mapped elsewhere, the key is read from there alone.
    let mut mapped = args();
    mapped.fields = FieldMap::parse(&["idempotency_key=/headers/idem"]).unwrap();
    assert_eq!(audit_lines(&same, &mapped).keyed_requests, 0);
}
