//! `oncely usage [--since DURATION] [--json]`; `--by hour [--format csv|json]`: the rows
//! a billing system imports; and `--statement PRINCIPAL [--format md|html]`: one
//! account's bill explained.
//!
//! Each covers the whole period asked for: the store's usage history (what records that
//! left the ledger counted, kept per hour for `usage_retention`) with the records still
//! in it. A period starts at the start of its first hour.

use std::time::Duration;

use oncely_core::units::format_duration;
use oncely_core::Timestamp;
use oncely_store::RepeatKind;

use super::ledger::{principal_filter, store_failure};
use super::store::open;
use super::store::StoreArgs;
use super::{Failure, Outcome};
use crate::records;
use crate::statement::{Answer, Format, HourLine, Line, Source, Statement};

/// What `--by` groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// Per principal, route and hour.
    Hour,
}

/// How `usage` writes a statement (`md`, `html`) or the rows of `--by hour` (`csv`,
/// `json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UsageFormat {
    /// A Markdown statement.
    Md,
    /// A statement as one self-contained HTML page.
    Html,
    /// Rows as CSV with a header line.
    Csv,
    /// Rows as one JSON array.
    Json,
}

/// The statement's format: `md` (default) or `html`.
pub(crate) fn statement_format(format: Option<UsageFormat>) -> Result<Format, Failure> {
    match format {
        None | Some(UsageFormat::Md) => Ok(Format::Md),
        Some(UsageFormat::Html) => Ok(Format::Html),
        Some(_) => Err(Failure::usage(
            "a statement is written as --format md or html (csv and json are for --by hour)",
        )),
    }
}

/// `--format` without `--statement` or `--by hour` is a mistake.
pub(crate) fn no_format(format: Option<UsageFormat>) -> Result<(), Failure> {
    match format {
        None => Ok(()),
        Some(_) => Err(Failure::usage(
            "--format needs --statement (md, html) or --by hour (csv, json)",
        )),
    }
}

/// Where a period of `since` starts, read on the store's clock (`None`: everything).
async fn period_start(
    store: &dyn oncely_store::Store,
    since: Option<Duration>,
) -> Result<(Timestamp, Option<Timestamp>), Failure> {
    let now = store.now().await.map_err(store_failure)?;
    Ok((now, since.map(|d| crate::operations::period_start(now, d))))
}

pub(crate) async fn run(since: Option<Duration>, json: bool, args: &StoreArgs) -> Outcome {
    let ledger = open(args).await?;
    let (_, from) = period_start(&*ledger.store, since).await?;
    let usage = ledger.store.usage(from).await.map_err(store_failure)?;
    if json {
        println!("{}", records::usage(&usage));
        return Ok(());
    }
    println!(
        "{:<64} {:>8} {:>12} {:>8} {:>12}",
        "PRINCIPAL", "FRESH", "FRESH_UNITS", "REPEATS", "REPEAT_UNITS"
    );
    for r in &usage.by_principal {
        println!(
            "{:<64} {:>8} {:>12} {:>8} {:>12}",
            r.principal, r.fresh, r.fresh_units, r.repeats, r.repeat_units
        );
    }
    let t = &usage.totals;
    println!(
        "{:<64} {:>8} {:>12} {:>8} {:>12}",
        "TOTAL", t.fresh, t.fresh_units, t.repeats, t.repeat_units
    );
    Ok(())
}

/// `oncely usage --by hour [--since DURATION] [--format csv|json]`.
pub(crate) async fn by_hour(
    since: Option<Duration>,
    format: Option<UsageFormat>,
    args: &StoreArgs,
) -> Outcome {
    let json = match format {
        None | Some(UsageFormat::Csv) => false,
        Some(UsageFormat::Json) => true,
        Some(_) => {
            return Err(Failure::usage(
                "--by hour writes --format csv or json (md and html are for --statement)",
            ))
        }
    };
    let ledger = open(args).await?;
    let (_, from) = period_start(&*ledger.store, since).await?;
    let rows = ledger
        .store
        .usage_by_hour(from)
        .await
        .map_err(store_failure)?;
    if json {
        println!("{}", records::usage_hours(&rows));
    } else {
        print!("{}", records::usage_hours_csv(&rows));
    }
    Ok(())
}

/// How many repeats a statement lists; its totals count every one.
pub(crate) const STATEMENT_LINES: usize = 1000;

/// `oncely usage --statement PRINCIPAL [--since DURATION] [--format md|html]`.
pub(crate) async fn statement(
    principal: &str,
    since: Option<Duration>,
    format: Format,
    args: &StoreArgs,
) -> Outcome {
    let ledger = open(args).await?;
    let store = &ledger.store;
    let hash = principal_filter(store, principal).await?;
    let (now, from) = period_start(&**store, since).await?;
    let usage = store.usage(from).await.map_err(store_failure)?;
    let charged = usage
        .by_principal
        .iter()
        .find(|r| r.principal == hash)
        .cloned()
        .unwrap_or_default();
    let events = store
        .repeat_events(&hash, from, STATEMENT_LINES)
        .await
        .map_err(store_failure)?;
    let period = match (since, from) {
        (Some(d), Some(from)) => format!(
            "the last {} (from {}, the start of its first hour, to {})",
            format_duration(d),
            records::hour(from),
            now.to_rfc3339()
        ),
        _ => format!("everything on record, to {}", now.to_rfc3339()),
    };
    let answer = |kind| match kind {
        RepeatKind::Joined => Answer::Joined,
        RepeatKind::Replayed => Answer::Replayed,
    };
    let statement = Statement {
        account: principal.to_owned(),
        account_hash: (hash != principal).then(|| hash.clone()),
        period,
        generated: now,
        source: Source::Ledger,
        charged: charged.fresh,
        charged_units: charged.fresh_units,
        repeats: events.total,
        repeat_units: events.total_units,
        lines: events
            .listed
            .into_iter()
            .map(|e| Line {
                at: e.at,
                route: e.route,
                count: e.count,
                units: e.units,
                answer: answer(e.kind),
            })
            .collect(),
        older: events
            .older
            .into_iter()
            .map(|h| HourLine {
                hour: h.hour,
                route: h.route,
                count: h.repeats,
                units: h.repeat_units,
                joined: h.joined,
                replayed: h.replayed,
            })
            .collect(),
    };
    print!("{}", statement.render(format));
    Ok(())
}
