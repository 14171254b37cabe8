//! The seed's day: six dialogues rendered for one account, five of them twice, the copies
//! 16 s to almost two hours after originals of 68-120 s. 119,160 characters were charged,
//! 55,026 of them for the copies.

use std::io::Write;

use oncely_audit::{run, Credit, RawAuditArgs};
use serde_json::Value;

use crate::{audit_lines, line, DAY};

const ACCOUNT: &str = "acct_audiobook";

/// (characters, render seconds, seconds after the original finished that the copy came).
const DIALOGUES: [(usize, i64, Option<i64>); 6] = [
    (12_000, 68, Some(16)),
    (10_500, 120, Some(5 * 60)),
    (11_200, 95, Some(41 * 60)),
    (9_108, 88, None),
    (9_826, 74, Some(83 * 60)),
    (11_500, 110, Some(118 * 60)),
];

/// Text of exactly `chars` characters, different per dialogue, with non-ASCII letters so
/// that characters are not bytes.
fn dialogue_text(i: usize, chars: usize) -> String {
    let words = [
        "Élise:", "the", "river", "was", "quiet", "Ben:", "and", "cold", "ça", "va?",
    ];
    let mut out = format!("Dialogue {i}. ");
    let mut n = 0;
    while out.chars().count() < chars {
        out.push_str(words[(n * 7 + i) % words.len()]);
        out.push(' ');
        n += 1;
    }
    out.chars().take(chars).collect()
}

/// The day's log, in time order.
pub(crate) fn seed_day() -> Vec<String> {
    let mut lines: Vec<(i64, String)> = Vec::new();
    let mut start = DAY;
    for (i, &(chars, secs, copy_after)) in DIALOGUES.iter().enumerate() {
        let text = serde_json::to_string(&dialogue_text(i, chars)).unwrap();
        let body =
            format!(r#"{{"dialogue":{i},"voices":["Élise","Ben"],"speed":1.0,"text":{text}}}"#);
        lines.push((
            start,
            line(start, ACCOUNT, &body, chars as u64, secs as u64 * 1000),
        ));
        if let Some(after) = copy_after {
            // The assistant sends the same text again, its JSON spelled differently.
            let copy = format!(
                r#"{{ "text": {text}, "speed": 1, "voices": [ "Élise", "Ben" ], "dialogue": {i} }}"#
            );
            let at = start + (secs + after) * 1000;
            lines.push((
                at,
                line(at, ACCOUNT, &copy, chars as u64, secs as u64 * 1000),
            ));
        }
        start += 25 * 60 * 1000;
    }
    lines.sort_by_key(|l| l.0);
    lines.into_iter().map(|l| l.1).collect()
}

#[test]
fn the_seed_day_gives_the_seed_figures() {
    let lines = seed_day();
    assert_eq!(lines.len(), 11);
    let report = audit_lines(&lines, &crate::args());
    assert_eq!(report.requests, 11);
    assert_eq!(report.units, 119_160);
    assert_eq!(report.duplicate_requests, 5);
    assert_eq!(report.duplicate_units, 55_026);
    assert_eq!((report.during, report.after), (0, 5));
    assert_eq!(report.unreadable_lines, 0);
    assert_eq!(report.out_of_order_lines, 0);
    assert_eq!(report.credit, Credit::Units(55_026));
    assert_eq!(report.by_principal.len(), 1);
    let p = &report.by_principal[0];
    assert_eq!(p.principal, ACCOUNT);
    assert_eq!((p.requests, p.units), (11, 119_160));
    assert_eq!((p.duplicate_requests, p.duplicate_units), (5, 55_026));
    assert_eq!(p.credit, Credit::Units(55_026));
    // The delays after the originals finished: 16 s to 1 h 58 m.
    assert_eq!(report.delays.after.min_ms, Some(16_000));
    assert_eq!(report.delays.after.max_ms, Some(118 * 60_000));
    assert_eq!(report.delays.during.count, 0);
    let buckets: Vec<u64> = report
        .delays
        .after
        .buckets
        .iter()
        .map(|b| b.count)
        .collect();
    assert_eq!(buckets, [0, 0, 1, 1, 1, 2, 0]);
    // Five originals repeated once each; the sixth dialogue is not among them.
    assert_eq!(report.top_repeats.len(), 5);
    assert!(report
        .top_repeats
        .iter()
        .all(|t| t.repeats == 1 && t.after == 1));
    let mut repeated_units: Vec<u64> = report.top_repeats.iter().map(|t| t.repeat_units).collect();
    repeated_units.sort();
    assert_eq!(repeated_units, [9_826, 10_500, 11_200, 11_500, 12_000]);
    assert!(report
        .top_repeats
        .iter()
        .all(|t| t.path == "/v1/render" && t.method == "POST"));
}

#[test]
fn the_seed_day_through_the_command_with_a_price_and_a_credits_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("day.jsonl");
    std::fs::write(&log, seed_day().join("\n")).unwrap();
    let csv = dir.path().join("credits.csv");
    let args = RawAuditArgs {
        files: vec![log.display().to_string()],
        price_per_unit: Some("0.0001".into()),
        credits_csv: Some(csv.display().to_string()),
        json: true,
        ..RawAuditArgs::default()
    }
    .resolve()
    .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let report = run(&args, &mut out, &mut err).unwrap();
    assert!(err.is_empty());
    assert_eq!(report.credit, Credit::Money(5.5026));

    // One JSON document with the contract's members and types.
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 1);
    let v: Value = serde_json::from_str(&text).unwrap();
    for (name, expected) in [
        ("requests", 11.0),
        ("units", 119_160.0),
        ("duplicate_requests", 5.0),
        ("duplicate_units", 55_026.0),
        ("during", 0.0),
        ("after", 5.0),
        ("unreadable_lines", 0.0),
    ] {
        assert!(v[name].is_u64(), "{name} is a whole number");
        assert_eq!(v[name].as_f64(), Some(expected), "{name}");
    }
    let p = &v["by_principal"][0];
    assert_eq!(p["principal"], ACCOUNT);
    assert_eq!(p["requests"], 11);
    assert_eq!(p["units"], 119_160);
    assert_eq!(p["duplicate_requests"], 5);
    assert_eq!(p["duplicate_units"], 55_026);
    assert_eq!(p["credit"].as_f64(), Some(5.5026));
    assert_eq!(v["price_per_unit"].as_f64(), Some(0.0001));
    assert_eq!(v["window"], "3h");

    assert_eq!(
        std::fs::read_to_string(&csv).unwrap(),
        "principal,duplicate_requests,duplicate_units,credit\nacct_audiobook,5,55026,5.5026\n"
    );
}

#[test]
fn the_seed_day_from_gzip_and_in_the_human_report() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("day.log"); // no .gz: compression is read from the content
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(seed_day().join("\n").as_bytes()).unwrap();
    std::fs::write(&log, gz.finish().unwrap()).unwrap();
    let args = RawAuditArgs {
        files: vec![log.display().to_string()],
        ..RawAuditArgs::default()
    }
    .resolve()
    .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let report = run(&args, &mut out, &mut err).unwrap();
    assert_eq!((report.units, report.duplicate_units), (119_160, 55_026));
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("11 requests, 119,160 units (window 3h)"),
        "{text}"
    );
    assert!(
        text.contains("5 requests (45.5%), 55,026 units (46.2%)"),
        "{text}"
    );
    assert!(
        text.contains("after the original finished (a guard replays): 5"),
        "{text}"
    );
    assert!(
        text.contains("16s to 1h58m after the original finished"),
        "{text}"
    );
    assert!(text.contains("to credit: 55,026 units"), "{text}");
    assert!(text.contains("acct_audiobook"), "{text}");
}
