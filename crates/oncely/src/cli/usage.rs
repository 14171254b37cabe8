//! `oncely usage [--since DURATION] [--json]`, and `--statement PRINCIPAL [--format
//! md|html]`: one account's bill explained.

use std::time::Duration;

use oncely_core::units::format_duration;
use oncely_store::RepeatKind;

use super::ledger::{principal_filter, store_failure};
use super::store::open;
use super::store::StoreArgs;
use super::Outcome;
use crate::records;
use crate::statement::{Answer, Format, Line, Source, Statement};

pub(crate) async fn run(since: Option<Duration>, json: bool, args: &StoreArgs) -> Outcome {
    let ledger = open(args).await?;
    let since = match since {
        Some(d) => Some(ledger.store.now().await.map_err(store_failure)?.minus(d)),
        None => None,
    };
    let usage = ledger.store.usage(since).await.map_err(store_failure)?;
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
    let now = store.now().await.map_err(store_failure)?;
    let from = since.map(|d| now.minus(d));
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
            "the last {} (since {})",
            format_duration(d),
            from.to_rfc3339()
        ),
        _ => format!("everything the ledger holds, to {}", now.to_rfc3339()),
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
                units: e.units,
                answer: match e.kind {
                    RepeatKind::Joined => Answer::Joined,
                    RepeatKind::Replayed => Answer::Replayed,
                },
            })
            .collect(),
    };
    print!("{}", statement.render(format));
    Ok(())
}
