//! Inputs: several files, standard input stand-ins, gzip, unreadable lines, bad paths.

use std::io::{Cursor, Read, Write};

use oncely_audit::{audit, run, Input, RawAuditArgs};

use crate::{args, audit_lines, line, DAY};

const BODY: &str = r#"{"text":"hello"}"#;

#[test]
fn unreadable_lines_are_counted_with_their_numbers_and_never_stop_the_run() {
    let good = |ms: i64| line(DAY + ms, "p", BODY, 2, 0);
    let lines = [
        good(0),
        good(1_000),
        "{\"ts\": \"2026-11-06T09:00:02Z\", \"principal\": ".to_string(),
        good(3_000),
        r#"{"ts":"not a time","principal":"p","method":"POST","path":"/"}"#.to_string(),
        String::new(),
        "\u{1}binary\u{2}".to_string(),
        good(7_000),
    ];
    let report = audit_lines(&lines, &args());
    assert_eq!(report.requests, 4);
    assert_eq!(report.duplicate_requests, 3);
    assert_eq!(report.unreadable_lines, 3);
    let numbers: Vec<u64> = report.unreadable_examples.iter().map(|u| u.line).collect();
    assert_eq!(numbers, [3, 5, 7]);
    assert!(report.unreadable_examples[0]
        .reason
        .starts_with("not a JSON object"));
    assert!(report.unreadable_examples[1].reason.contains("\"ts\""));
    assert!(report.unreadable_examples.iter().all(|u| u.file == "-"));
}

#[test]
fn only_the_first_unreadable_lines_are_kept_but_all_are_counted() {
    let mut lines: Vec<String> = (0..25).map(|i| format!("garbage {i}")).collect();
    lines.push(line(DAY, "p", BODY, 1, 0));
    let report = audit_lines(&lines, &args());
    assert_eq!((report.unreadable_lines, report.requests), (25, 1));
    assert_eq!(report.unreadable_examples.len(), 10);
    assert_eq!(report.unreadable_examples[9].line, 10);
}

#[test]
fn a_reader_like_standard_input_plain_or_gzip() {
    let text = [line(DAY, "p", BODY, 4, 0), line(DAY + 9, "p", BODY, 4, 0)].join("\n");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(text.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();

    /// A reader that hands out a few bytes at a time, as a pipe does.
    struct Trickle(Cursor<Vec<u8>>);
    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(3);
            self.0.read(&mut buf[..n])
        }
    }
    for bytes in [text.into_bytes(), gz] {
        let input = Input::from_reader("-", Trickle(Cursor::new(bytes))).unwrap();
        let report = audit(vec![input], &args());
        assert_eq!((report.requests, report.duplicate_units), (2, 4));
    }
}

#[test]
fn several_files_are_merged_by_time() {
    // Two gateway instances, each with its own log of the same hour; a copy landed on
    // the other instance. Read one after the other they would look hours apart.
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl.gz");
    let other = r#"{"text":"other"}"#;
    std::fs::write(
        &a,
        [
            line(DAY, "p", BODY, 10, 60_000),
            line(DAY + 4 * 3_600_000, "p", other, 1, 0),
        ]
        .join("\n"),
    )
    .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(
        [
            line(DAY + 600_000, "p", BODY, 10, 60_000),
            line(DAY + 4 * 3_600_000 + 5, "p", other, 1, 0),
        ]
        .join("\n")
        .as_bytes(),
    )
    .unwrap();
    std::fs::write(&b, gz.finish().unwrap()).unwrap();
    let args = RawAuditArgs {
        files: vec![a.display().to_string(), b.display().to_string()],
        json: true,
        ..RawAuditArgs::default()
    }
    .resolve()
    .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let report = run(&args, &mut out, &mut err).unwrap();
    assert_eq!(report.requests, 4);
    assert_eq!((report.duplicate_requests, report.duplicate_units), (2, 11));
    assert_eq!(report.out_of_order_lines, 0);
    assert_eq!(report.inputs.len(), 2);
    let top = &report.top_repeats[0];
    assert_eq!(top.source, format!("{}:1", a.display()));
}

#[test]
fn a_missing_file_is_a_bad_argument_and_unreadable_lines_are_noted_on_stderr() {
    let args = RawAuditArgs {
        files: vec!["/nonexistent/requests.jsonl".into()],
        ..RawAuditArgs::default()
    }
    .resolve()
    .unwrap();
    let e = run(&args, &mut Vec::new(), &mut Vec::new()).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e
        .to_string()
        .starts_with("cannot open /nonexistent/requests.jsonl"));

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("x.jsonl");
    std::fs::write(&log, format!("{}\nnot json\n", line(DAY, "p", BODY, 1, 0))).unwrap();
    let args = RawAuditArgs {
        files: vec![log.display().to_string()],
        credits_csv: Some("/nonexistent/dir/credits.csv".into()),
        ..RawAuditArgs::default()
    }
    .resolve()
    .unwrap();
    let e = run(&args, &mut Vec::new(), &mut Vec::new()).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().starts_with("cannot write credits CSV"));

    let mut args = args;
    args.credits_csv = None;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let report = run(&args, &mut out, &mut err).unwrap();
    assert_eq!(report.unreadable_lines, 1);
    let err = String::from_utf8(err).unwrap();
    assert_eq!(err.lines().count(), 1);
    assert!(err.contains(&format!("{}:2:", log.display())), "{err}");
    assert!(String::from_utf8(out)
        .unwrap()
        .contains("unreadable lines: 1"));
}

#[test]
fn hundreds_of_inputs_are_merged() {
    // An hourly log per gateway instance: 300 inputs, each with its own request and a
    // copy of one shared request, all in the same hour.
    let shared = r#"{"text":"shared"}"#;
    let inputs = (0..300)
        .map(|i| {
            let own = format!(r#"{{"text":"own {i}"}}"#);
            let text = [
                line(DAY + i * 10, "p", &own, 1, 0),
                line(DAY + 5_000 + i * 10, "p", shared, 2, 0),
            ]
            .join("\n");
            Input::from_reader(&format!("log-{i}"), Cursor::new(text.into_bytes())).unwrap()
        })
        .collect();
    let report = audit(inputs, &args());
    assert_eq!(report.requests, 600);
    assert_eq!(
        (report.duplicate_requests, report.duplicate_units),
        (299, 598)
    );
    assert_eq!(report.out_of_order_lines, 0);
    assert_eq!(report.top_repeats[0].source, "log-0:2");
}
