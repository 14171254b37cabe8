//! The window and the two kinds of repeat, judged as the gateway would.

use std::time::Duration;

use crate::{args, audit_lines, line, DAY};

const BODY: &str = r#"{"text":"hello"}"#;
const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;

#[test]
fn the_window_is_measured_from_the_originals_completion() {
    // Original at DAY, runs 60 s; window 3h: its record lives until DAY + 60 s + 3h.
    let end_of_window = DAY + MIN + 3 * HOUR;
    let inside = audit_lines(
        &[
            line(DAY, "p", BODY, 10, 60_000),
            line(end_of_window - 1, "p", BODY, 10, 0),
        ],
        &args(),
    );
    assert_eq!((inside.duplicate_requests, inside.duplicate_units), (1, 10));
    assert_eq!(inside.after, 1);
    assert_eq!(inside.delays.after.max_ms, Some((3 * HOUR - 1) as u64));

    let outside = audit_lines(
        &[
            line(DAY, "p", BODY, 10, 60_000),
            line(end_of_window, "p", BODY, 10, 0),
        ],
        &args(),
    );
    assert_eq!(outside.duplicate_requests, 0);
    assert_eq!(outside.requests, 2);
}

#[test]
fn a_shorter_window_changes_the_verdict() {
    let lines = [
        line(DAY, "p", BODY, 1, 0),
        line(DAY + 100_000, "p", BODY, 1, 0),
    ];
    assert_eq!(audit_lines(&lines, &args()).duplicate_requests, 1);
    let mut short = args();
    short.window = Duration::from_secs(90);
    assert_eq!(audit_lines(&lines, &short).duplicate_requests, 0);
}

#[test]
fn during_joins_the_running_original_after_would_be_replayed() {
    let report = audit_lines(
        &[
            line(DAY, "p", BODY, 7, 120_000),
            line(DAY + 30_000, "p", BODY, 7, 120_000),
            line(DAY + 119_999, "p", BODY, 7, 120_000),
            line(DAY + 120_000, "p", BODY, 7, 120_000),
            line(DAY + 136_000, "p", BODY, 7, 120_000),
        ],
        &args(),
    );
    assert_eq!(report.duplicate_requests, 4);
    assert_eq!((report.during, report.after), (2, 2));
    // During: measured from the original's start; after: from its completion.
    assert_eq!(report.delays.during.min_ms, Some(30_000));
    assert_eq!(report.delays.during.max_ms, Some(119_999));
    assert_eq!(report.delays.after.min_ms, Some(0));
    assert_eq!(report.delays.after.max_ms, Some(16_000));
    let p = &report.by_principal[0];
    assert_eq!((p.during, p.after), (2, 2));
}

#[test]
fn repeats_do_not_renew_the_record() {
    // A, A+1h, A+2h: both copies repeat A.
    let chain = audit_lines(
        &[
            line(DAY, "p", BODY, 1, 0),
            line(DAY + HOUR, "p", BODY, 1, 0),
            line(DAY + 2 * HOUR, "p", BODY, 1, 0),
        ],
        &args(),
    );
    assert_eq!(chain.duplicate_requests, 2);
    assert_eq!(chain.top_repeats[0].repeats, 2);

    // A, A+2h, A+4h, A+5h: A+2h repeats A; A+4h is past A's window (not renewed by the
    // repeat), so it executes as a new original, and A+5h repeats that one.
    let renewed = audit_lines(
        &[
            line(DAY, "p", BODY, 1, 0),
            line(DAY + 2 * HOUR, "p", BODY, 1, 0),
            line(DAY + 4 * HOUR, "p", BODY, 1, 0),
            line(DAY + 5 * HOUR, "p", BODY, 1, 0),
        ],
        &args(),
    );
    assert_eq!(renewed.duplicate_requests, 2);
    assert_eq!(renewed.top_repeats.len(), 2);
    assert!(renewed.top_repeats.iter().all(|t| t.repeats == 1));
    let mut firsts: Vec<&str> = renewed
        .top_repeats
        .iter()
        .map(|t| t.first_seen.as_str())
        .collect();
    firsts.sort();
    assert_eq!(firsts, [crate::ts(DAY), crate::ts(DAY + 4 * HOUR)]);
}

#[test]
fn memory_follows_the_window_not_the_log() {
    // 2,000 distinct requests a minute apart with a 10 minute window: at most about ten
    // originals are remembered at once.
    let lines: Vec<String> = (0..2_000)
        .map(|i| line(DAY + i * MIN, "p", &format!(r#"{{"n":{i}}}"#), 1, 0))
        .collect();
    let mut a = args();
    a.window = Duration::from_secs(600);
    let report = audit_lines(&lines, &a);
    assert_eq!(report.requests, 2_000);
    assert!(report.peak_originals <= 11, "{}", report.peak_originals);
}

#[test]
fn modest_disorder_is_put_back_in_order() {
    // The copy is written to the log before its original (two workers, one log).
    let lines = [
        line(DAY + 2 * MIN, "p", BODY, 5, 10_000),
        line(DAY, "p", BODY, 5, 10_000),
    ];
    let report = audit_lines(&lines, &args());
    assert_eq!(report.duplicate_requests, 1);
    assert_eq!(report.after, 1);
    assert_eq!(report.out_of_order_lines, 0);
    assert_eq!(report.top_repeats[0].first_seen, crate::ts(DAY));
    assert_eq!(report.top_repeats[0].line, 2);

    // Beyond the reorder buffer the straggler is still judged, and counted.
    let mut strict = args();
    strict.reorder = Duration::ZERO;
    let report = audit_lines(&lines, &strict);
    assert_eq!(report.duplicate_requests, 1);
    assert_eq!(report.out_of_order_lines, 1);
}
