//! `oncely audit`: the command line over `oncely_audit`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::Args;
use oncely_audit::{RawAuditArgs, Report};
use oncely_core::Timestamp;

use super::usage::STATEMENT_LINES;
use super::{Failure, Outcome};
use crate::statement::{file_name, Answer, Format, Line, Source, Statement};

/// `oncely audit FILE... [--window D] [--field NAME=SOURCE]... [--price-per-unit P]
/// [--credits-csv F] [--json] [--statements DIR [--statements-format md|html]]`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// JSON-lines request logs, plain or gzip; `-` for standard input.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<String>,
    /// How long after an original an identical request counts as its repeat.
    #[arg(long, value_name = "DURATION")]
    window: Option<String>,
    /// Where a field is found in the log, e.g. `principal=account_id` or `ts=time`.
    #[arg(long = "field", value_name = "NAME=SOURCE")]
    fields: Vec<String>,
    /// A JSON pointer left out of the body before comparing (repeatable).
    #[arg(long = "ignore-field", value_name = "POINTER")]
    ignore_fields: Vec<String>,
    /// The price of one unit: the credit is then money.
    #[arg(long, value_name = "P")]
    price_per_unit: Option<String>,
    /// Writes one line per principal to credit.
    #[arg(long, value_name = "F")]
    credits_csv: Option<String>,
    /// How much disorder in time within one input is undone (default 5m).
    #[arg(long, value_name = "DURATION")]
    reorder: Option<String>,
    /// How many of the most repeated requests to list (default 10).
    #[arg(long, value_name = "N")]
    top: Option<String>,
    /// One JSON document on standard output.
    #[arg(long)]
    json: bool,
    /// Writes one statement per principal into this directory (created if needed): what
    /// it was charged, each repeat, and the credit owed.
    #[arg(long, value_name = "DIR")]
    statements: Option<PathBuf>,
    /// How the statements are written.
    #[arg(long, value_enum, default_value_t, requires = "statements")]
    statements_format: Format,
}

/// Runs the audit on a blocking thread (it spreads its own work over threads).
pub(super) async fn run(args: AuditArgs) -> Outcome {
    let raw = RawAuditArgs {
        files: args.files,
        window: args.window,
        fields: args.fields,
        ignore_fields: args.ignore_fields,
        price_per_unit: args.price_per_unit,
        credits_csv: args.credits_csv,
        json: args.json,
        progress: !args.json && std::io::stderr().is_terminal(),
        reorder: args.reorder,
        top: args.top,
    };
    let mut resolved = raw.resolve().map_err(|e| Failure {
        code: e.exit_code() as u8,
        message: format!("audit: {e}"),
    })?;
    if let Some(dir) = &args.statements {
        // Before the long read, so that a directory that cannot be made fails at once.
        std::fs::create_dir_all(dir).map_err(|e| {
            Failure::usage(format!(
                "audit: cannot create the statements directory {}: {e}",
                dir.display()
            ))
        })?;
        resolved.listed_repeats = STATEMENT_LINES;
    }
    let report = tokio::task::spawn_blocking(move || {
        let mut stdout = std::io::stdout().lock();
        let mut stderr = std::io::stderr();
        oncely_audit::run(&resolved, &mut stdout, &mut stderr).map(|r| (r, resolved))
    })
    .await
    .map_err(|e| Failure::runtime(format!("audit: {e}")))?
    .map_err(|e| Failure {
        code: e.exit_code() as u8,
        message: format!("audit: {e}"),
    })?;
    if let Some(dir) = &args.statements {
        write_statements(dir, args.statements_format, &report.0, &report.1)?;
    }
    Ok(())
}

/// One statement per principal of the report, into `dir`.
fn write_statements(
    dir: &Path,
    format: Format,
    report: &Report,
    args: &oncely_audit::AuditArgs,
) -> Outcome {
    let generated = oncely_store::clock::system_now();
    let inputs = report.inputs.join(", ");
    let period = format!(
        "the requests in {inputs} (a repeat: an identical request within {} of its original)",
        report.window
    );
    for p in &report.by_principal {
        let credit = match args.price_per_unit {
            Some(price) => format!(
                "{} ({} units at {price} per unit)",
                p.credit, p.duplicate_units
            ),
            None => format!("{} units", p.duplicate_units),
        };
        let statement = Statement {
            account: p.principal.clone(),
            account_hash: None,
            period: period.clone(),
            generated,
            source: Source::Audit { credit },
            charged: p.requests,
            charged_units: p.units,
            repeats: p.duplicate_requests,
            repeat_units: p.duplicate_units,
            lines: p
                .repeats
                .iter()
                .map(|r| Line {
                    at: Timestamp(r.ts),
                    route: format!("{} {}", r.method, r.path),
                    count: 1,
                    units: r.units,
                    answer: if r.during {
                        Answer::Joined
                    } else {
                        Answer::Replayed
                    },
                })
                .collect(),
            older: Vec::new(),
        };
        let path = dir.join(file_name(&p.principal, format));
        std::fs::write(&path, statement.render(format)).map_err(|e| {
            Failure::runtime(format!("audit: cannot write {}: {e}", path.display()))
        })?;
    }
    Ok(())
}
