//! `oncely audit` without the rest of the binary, for benchmarks and quick looks.
//!
//! Run with: `cargo run --release -p oncely-audit --example audit -- FILE... [--window 3h]
//! [--field NAME=SOURCE]... [--ignore-field POINTER]... [--price-per-unit P]
//! [--credits-csv F] [--reorder 5m] [--top N] [--json]`

use std::io::IsTerminal;

use oncely_audit::{run, RawAuditArgs};

fn main() {
    let mut raw = RawAuditArgs::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next().unwrap_or_else(|| {
                eprintln!("oncely audit: {name} needs a value");
                std::process::exit(2)
            })
        };
        match arg.as_str() {
            "--json" => raw.json = true,
            "--window" => raw.window = Some(value("--window")),
            "--field" => raw.fields.push(value("--field")),
            "--ignore-field" => raw.ignore_fields.push(value("--ignore-field")),
            "--price-per-unit" => raw.price_per_unit = Some(value("--price-per-unit")),
            "--credits-csv" => raw.credits_csv = Some(value("--credits-csv")),
            "--reorder" => raw.reorder = Some(value("--reorder")),
            "--top" => raw.top = Some(value("--top")),
            flag if flag.starts_with("--") => {
                eprintln!("oncely audit: unknown flag {flag}");
                std::process::exit(2)
            }
            _ => raw.files.push(arg),
        }
    }
    raw.progress = std::io::stderr().is_terminal() && !raw.json;
    let code = match raw
        .resolve()
        .and_then(|a| run(&a, &mut std::io::stdout().lock(), &mut std::io::stderr()))
    {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("oncely audit: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code)
}
