//! `oncely audit`: finds, in a request log a provider already has, the requests that
//! repeated an earlier identical one within the window — what a guard would have saved,
//! who was charged for it, and what to credit.
//!
//! No server is needed: the audit reads JSON lines (plain or gzip, files or standard
//! input), judges each request by the gateway's own rule, and reports.
//!
//! # Calling it
//!
//! The binary turns what the user typed into [`RawAuditArgs`], resolves it (a bad
//! argument is an [`AuditError`] whose [`exit_code`](AuditError::exit_code) is 2 and whose
//! message is one line), and calls [`run`]:
//!
//! ```no_run
//! use oncely_audit::{run, RawAuditArgs};
//! let raw = RawAuditArgs {
//!     files: vec!["requests.jsonl.gz".into()],
//!     window: Some("3h".into()),
//!     price_per_unit: Some("0.00003".into()),
//!     ..RawAuditArgs::default()
//! };
//! let args = raw.resolve().unwrap_or_else(|e| {
//!     eprintln!("oncely audit: {e}");
//!     std::process::exit(e.exit_code())
//! });
//! let report = run(&args, &mut std::io::stdout(), &mut std::io::stderr());
//! ```
//!
//! The flags map one to one onto [`RawAuditArgs`]: `FILE...` → `files` (`-` is standard
//! input), `--window D` → `window`, `--field NAME=SOURCE` (repeatable) → `fields`,
//! `--ignore-field POINTER` (repeatable) → `ignore_fields`, `--price-per-unit P`,
//! `--credits-csv F`, `--json`; two extensions, `--reorder D` (default 5m) and `--top N`
//! (default 10); and `progress` = "standard error is a terminal and not `--json`".
//! `examples/audit.rs` is a complete, minimal front end.
//!
//! Unreadable lines never stop a run: they are counted (`unreadable_lines`), the first
//! ten are listed with their line numbers (`unreadable_examples`, and the first on
//! standard error), and the exit code stays 0.
//!
//! # Input
//!
//! One JSON object a line. `ts`: RFC 3339, or a number of seconds (milliseconds when
//! at least 1e11) since the epoch. `principal`: a string or number. `method`, `path`:
//! strings. `body`: any JSON value, or a string with the body's text; `body_sha256`: 64
//! hex digits (an optional `sha256:` prefix). `units`: a whole number (a line without
//! one counts one unit, and `units_missing` says how many). `duration_ms`: a number (0
//! when absent). `idempotency_key` (also read as `Idempotency-Key`, `idempotency-key` or
//! `idempotencyKey`): the key the client sent, a string or number; anything else is no
//! key. `--field NAME=SOURCE` reads a field from another member, or from inside
//! one with a JSON pointer (`--field principal=/auth/account`; a mapped
//! `idempotency_key` is read from there alone). A line that lacks `ts`,
//! `principal`, `method` or `path`, or has one of the wrong type, is unreadable, with the
//! reason; so is a line over [`MAX_LINE`] bytes.
//!
//! # Output
//!
//! `--json`: the contract's members (`requests`, `units`, `duplicate_requests`,
//! `duplicate_units`, `during`, `after`, `churned`, `unreadable_lines`, `by_principal`
//! with `principal`, `requests`, `units`, `duplicate_requests`, `duplicate_units`,
//! `credit`) and these added ones: `share`, `request_share`, `credit` (the total),
//! `price_per_unit` (when given), `window`, `window_ms`, `delays` (`during` measured from
//! the original's start, `after` from its completion: count, min, max, mean, buckets),
//! `top_repeats` (each with its `churned` too), `unreadable_examples`,
//! `out_of_order_lines`, `units_missing`, `keyed_requests`, `inputs`, `peak_originals`;
//! per principal also `during`, `after` and `churned`. `credit` is always a
//! number: the duplicate units, or with `--price-per-unit` the money, rounded to six
//! decimals. `--credits-csv`: `principal,duplicate_requests,duplicate_units,credit`, one
//! line per principal with at least one repeat.
//!
//! # What counts as a repeat
//!
//! - **Identity**: principal + method + path (with query) + body. A JSON body is
//!   canonicalised (RFC 8785, numbers as exact decimals) with `--ignore-field` pointers
//!   removed; a body the log keeps as a string is the text sent (canonicalised too when it
//!   is JSON); without a body, `body_sha256` is the identity of the body; with neither,
//!   the body is empty. The canonical form is `oncely_core::canon`'s, the gateway's own;
//!   the key is the audit's own SHA-256 of those parts, not the
//!   gateway's fingerprint (which hashes the principal's keyed hash).
//! - **Window**: as in the gateway, the original's record lives from its start until its
//!   completion (`ts + duration_ms`) plus the window, and is not renewed by repeats. An
//!   identical request that starts before then is a repeat (`during` if before the
//!   completion, else `after`); the first one at or after is a new original. So with a 3h
//!   window, A, A+1h, A+2h are one original and two repeats; A, A+2h, A+4h (short runs)
//!   are an original, a repeat, and a new original.
//! - **Order**: lines are judged in time order. Several inputs are merged by time, and
//!   disorder within an input of up to [`AuditArgs::reorder`] (default 5m) is undone in a
//!   bounded buffer; later stragglers are judged as read and counted
//!   (`out_of_order_lines`).
//! - **Keys**: the Idempotency-Key is not part of the identity: a repeat under any key,
//!   or none, is a repeat. One whose line carries a key that no earlier request of its
//!   original (the original or a repeat of it) carried, while one of them carried another,
//!   is also `churned`: a retry loop that makes up a key per attempt, which key-based
//!   idempotency cannot catch. A repeat under a key seen before (a retry done right) and a
//!   line without a key are not churned; `keyed_requests` says how many lines carry one.
//! - **Units**: `units` as charged; a line without it counts one unit. `credit` is the
//!   duplicate units, or money when `--price-per-unit` is given.
//!
//! # Layout
//!
//! - [`args`]: raw arguments → validated [`AuditArgs`], field mapping.
//! - [`input`]: files, standard input and readers, gzip by magic bytes.
//! - `parse`: reader threads cut inputs into chunks of bounded lines, a parser pool
//!   (one thread per core) reads them; results come back in order.
//! - `line`: one JSON line → a request and its key.
//! - `canon`: the fast RFC 8785 writer and the request key.
//! - `order`: per-input reorder buffers and the time-ordered merge.
//! - `detect`: the streaming judgement, memory bounded by the window.
//! - [`report`]: the [`Report`], its JSON, human and CSV renderings.

pub mod args;
mod canon;
mod detect;
mod error;
pub mod input;
mod line;
mod order;
mod parse;
pub mod report;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use args::{AuditArgs, Field, FieldMap, RawAuditArgs, Source};
pub use error::AuditError;
pub use input::Input;
pub use parse::MAX_LINE;
pub use report::{Credit, ListedRepeat, PrincipalTotals, Report};

use detect::Detector;
use line::LineReader;
use order::Merged;
use report::UnreadableExample;

/// Runs `oncely audit`: opens the inputs, judges every line, writes the report (JSON with
/// `args.json`, else the human report) to `stdout`, the credits CSV if asked, and a one-line
/// note about unreadable lines to `stderr`. The progress bar, when asked for, is drawn on
/// the process's standard error only if that is a terminal.
pub fn run(
    args: &AuditArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<Report, AuditError> {
    let inputs = args
        .files
        .iter()
        .map(|path| Input::open(path))
        .collect::<Result<Vec<_>, _>>()?;
    // Created before the long read, so that a bad path fails at once.
    let csv = match &args.credits_csv {
        Some(path) => Some((
            path,
            File::create(path).map_err(|source| AuditError::CreditsCsv {
                path: path.clone(),
                source,
            })?,
        )),
        None => None,
    };

    let report = audit(inputs, args);

    if let Some((path, file)) = csv {
        let mut w = BufWriter::new(file);
        report
            .write_credits_csv(&mut w)
            .and_then(|()| w.flush())
            .map_err(|source| AuditError::CreditsCsv {
                path: path.clone(),
                source,
            })?;
    }
    if args.json {
        report.write_json(stdout)
    } else {
        report.write_human(stdout)
    }
    .and_then(|()| stdout.flush())
    .map_err(AuditError::Output)?;

    if report.unreadable_lines > 0 {
        let first = &report.unreadable_examples[0];
        // Standard error may be closed; the report is out, so this note is best effort.
        let _ = writeln!(
            stderr,
            "oncely audit: {} unreadable line(s) skipped and counted; first at {}:{}: {}",
            report.unreadable_lines, first.file, first.line, first.reason
        );
    }
    Ok(report)
}

/// Judges already opened inputs (files, standard input, or any reader wrapped in
/// [`Input::from_reader`]) and returns the report; writes nothing.
pub fn audit(inputs: Vec<Input>, args: &AuditArgs) -> Report {
    let window_ms = duration_ms(args.window);
    let total_size: Option<u64> = inputs.iter().map(|i| i.size).sum();
    let reader = LineReader::new(&args.fields, &args.ignore_fields);
    let mut merged = Merged::new(inputs, reader, duration_ms(args.reorder));
    let names = merged.names();
    let mut detector = Detector::new(window_ms, args.top, args.listed_repeats);
    let mut progress = Progress::new(args.progress, total_size);

    let mut bad = Vec::new();
    let mut n: u64 = 0;
    while let Some(located) = merged.next(&mut |u| bad.push(u)) {
        for u in bad.drain(..) {
            detector.unreadable(u);
        }
        detector.observe(located);
        n += 1;
        if n % 16_384 == 0 {
            progress.tick(n, merged.consumed());
        }
    }
    for u in bad.drain(..) {
        detector.unreadable(u);
    }
    detector.finish();
    progress.done();
    build_report(detector, names, args)
}

fn build_report(detector: Detector, names: Vec<String>, args: &AuditArgs) -> Report {
    let price = args.price_per_unit;
    let mut by_principal = detector.principals;
    for p in &mut by_principal {
        p.credit = Credit::of(p.duplicate_units, price);
    }
    by_principal.sort_by(|a, b| {
        b.duplicate_units
            .cmp(&a.duplicate_units)
            .then(b.duplicate_requests.cmp(&a.duplicate_requests))
            .then(a.principal.cmp(&b.principal))
    });
    let sum =
        |f: fn(&PrincipalTotals) -> u64| by_principal.iter().map(f).fold(0u64, u64::saturating_add);
    let requests = sum(|p| p.requests);
    let units = sum(|p| p.units);
    let duplicate_requests = sum(|p| p.duplicate_requests);
    let duplicate_units = sum(|p| p.duplicate_units);
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let mut top_repeats = detector.top;
    for t in &mut top_repeats {
        t.source = format!("{}:{}", names[t.source_file as usize], t.line);
    }
    Report {
        requests,
        units,
        duplicate_requests,
        duplicate_units,
        during: sum(|p| p.during),
        after: sum(|p| p.after),
        churned: sum(|p| p.churned),
        unreadable_lines: detector.unreadable,
        share: ratio(duplicate_units, units),
        request_share: ratio(duplicate_requests, requests),
        credit: Credit::of(duplicate_units, price),
        price_per_unit: price,
        window: oncely_core::units::format_duration(args.window),
        window_ms: duration_ms(args.window) as u64,
        delays: report::Delays {
            during: detector.during,
            after: detector.after,
        },
        top_repeats,
        unreadable_examples: detector
            .unreadable_examples
            .iter()
            .map(|u| UnreadableExample::from(u, &names))
            .collect(),
        out_of_order_lines: detector.out_of_order,
        units_missing: detector.units_missing,
        keyed_requests: detector.keyed,
        peak_originals: detector.peak_originals as u64,
        inputs: names,
        by_principal,
    }
}

fn duration_ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// A progress bar that appears only on a terminal and only once a run has taken a second.
struct Progress {
    enabled: bool,
    total: Option<u64>,
    started: Instant,
    bar: Option<ProgressBar>,
}

impl Progress {
    fn new(enabled: bool, total: Option<u64>) -> Progress {
        Progress {
            enabled,
            total,
            started: Instant::now(),
            bar: None,
        }
    }

    fn tick(&mut self, lines: u64, bytes: u64) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() {
            if self.started.elapsed() < Duration::from_secs(1) {
                return;
            }
            let target = ProgressDrawTarget::stderr_with_hz(4);
            let bar = match self.total {
                Some(total) => ProgressBar::with_draw_target(Some(total), target).with_style(
                    ProgressStyle::with_template(
                        "{bar:30} {binary_bytes}/{binary_total_bytes} {msg} ({eta} left)",
                    )
                    .expect("valid template"),
                ),
                None => ProgressBar::with_draw_target(None, target).with_style(
                    ProgressStyle::with_template("{spinner} {binary_bytes} {msg}")
                        .expect("valid template"),
                ),
            };
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(bytes);
            bar.set_message(format!("{} requests", report::thousands(lines)));
        }
    }

    fn done(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
