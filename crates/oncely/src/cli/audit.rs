//! `oncely audit`: the command line over `oncely_audit`.

use std::io::IsTerminal;

use clap::Args;
use oncely_audit::RawAuditArgs;

use super::{Failure, Outcome};

/// `oncely audit FILE... [--window D] [--field NAME=SOURCE]... [--price-per-unit P]
/// [--credits-csv F] [--json]`.
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
    let resolved = raw.resolve().map_err(|e| Failure {
        code: e.exit_code() as u8,
        message: format!("audit: {e}"),
    })?;
    tokio::task::spawn_blocking(move || {
        let mut stdout = std::io::stdout().lock();
        let mut stderr = std::io::stderr();
        oncely_audit::run(&resolved, &mut stdout, &mut stderr).map(|_| ())
    })
    .await
    .map_err(|e| Failure::runtime(format!("audit: {e}")))?
    .map_err(|e| Failure {
        code: e.exit_code() as u8,
        message: format!("audit: {e}"),
    })
}
